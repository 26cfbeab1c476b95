"""CPU latency of exported models: onnxruntime versus PyTorch eager (eval, no_grad), same process.

    python bench/export_latency.py [--timm]

For the default model (mobilenet_v3_small, 64 px) and resnet18 at 224 px, batch 1 and 32: the
median of alternating runs of each runtime, and the ratio eager / onnxruntime (> 1: ORT faster).
Both use all cores this process may use; weights are random (speed does not depend on them).
With `--timm`: the six timm families of the tests at 224 px (and torchvision's resnet18 beside them),
with the seconds each took to export (torch.export, then ONNX).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime as ort
import torch

from project.export.deployable import Deployable, dynamic_batch, example_batch
from project.export.onnx_target import write_torch_export
from project.model import ImageClassifier

CASES = [("mobilenet_v3_small", 64), ("resnet18", 224)]
TIMM_CASES = [
    ("resnet18", 224),
    ("timm/resnet18", 224),
    ("timm/convnext_nano", 224),
    ("timm/efficientnet_b0", 224),
    ("timm/vit_tiny_patch16_224", 224),
    ("timm/mobilenetv4_conv_small", 224),
    ("timm/regnetx_002", 224),
]
BATCHES = {1: 30, 32: 5}  # batch size -> timed repetitions per runtime


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    timm_families = "--timm" in sys.argv[1:]
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}, {threads} threads")
    print("| model | batch | eager ms | onnxruntime ms | eager / onnxruntime | export s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for backbone, size in TIMM_CASES if timm_families else CASES:
        classifier = ImageClassifier(num_classes=10, backbone=backbone, image_size=size, scheduler=None)
        model = Deployable(classifier).eval()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.onnx"
            start = time.perf_counter()
            program = torch.export.export(model, (example_batch(size),), dynamic_shapes=dynamic_batch())
            write_torch_export(program, size, path, opset=18)
            export_s = time.perf_counter() - start
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for batch, reps in BATCHES.items():
            e, o = compare(model, session, example_batch(size, batch), reps)
            print(f"| {backbone} {size}px | {batch} | {e:.1f} | {o:.1f} | {e / o:.2f} | {export_s:.1f} |")


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
