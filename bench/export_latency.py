"""CPU latency of exported models: onnxruntime versus PyTorch eager (eval, no_grad), same process.

    python bench/export_latency.py

For the default model (mobilenet_v3_small, 64 px) and resnet18 at 224 px, batch 1 and 32: the
median of alternating runs of each runtime, and the ratio eager / onnxruntime (> 1: ORT faster).
Both use all cores this process may use; weights are random (speed does not depend on them).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import onnxruntime as ort
import torch

from project.export.deployable import Deployable, dynamic_batch, example_batch
from project.export.onnx_target import write_torch_export
from project.model import ImageClassifier

CASES = [("mobilenet_v3_small", 64), ("resnet18", 224)]
BATCHES = {1: 30, 32: 5}  # batch size -> timed repetitions per runtime


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}, {threads} threads")
    print("| model | batch | eager ms | onnxruntime ms | eager / onnxruntime |")
    print("| --- | --- | --- | --- | --- |")
    for backbone, size in CASES:
        model = Deployable(ImageClassifier(num_classes=10, backbone=backbone, scheduler=None)).eval()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.onnx"
            program = torch.export.export(model, (example_batch(size),), dynamic_shapes=dynamic_batch())
            write_torch_export(program, size, path, opset=18)
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for batch, reps in BATCHES.items():
            e, o = compare(model, session, example_batch(size, batch), reps)
            print(f"| {backbone} {size}px | {batch} | {e:.1f} | {o:.1f} | {e / o:.2f} |")


def compare(model: torch.nn.Module, session: ort.InferenceSession, images: torch.Tensor, reps: int):
    """Median milliseconds of eager and onnxruntime, runs alternating so drift hits both alike."""
    array = images.numpy()

    def eager() -> None:
        with torch.no_grad():
            model(images)

    def onnxrt() -> None:
        session.run(["logits"], {"images": array})

    eager(), onnxrt()  # warm-up
    eager_times, ort_times = [], []
    for _ in range(reps):
        eager_times.append(timed(eager))
        ort_times.append(timed(onnxrt))
    return statistics.median(eager_times) * 1e3, statistics.median(ort_times) * 1e3


if __name__ == "__main__":
    main()
