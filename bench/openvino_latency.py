"""CPU latency of one export in OpenVINO against onnxruntime, same process, alternating.

    python bench/openvino_latency.py [--threads N] [--reps 30]

For the default model (mobilenet_v3_small, 64 px) and resnet18 at 224 px, batch 1 and 8: the
ONNX file as `export` writes it and the IR `export --format openvino` converts from it, each
opened as `infer` and `serve` open them (`project.deploy.classifier.open_session`), with the same
thread count, in alternating blocks of runs. Prints the median milliseconds of each and the
ratio onnxruntime / OpenVINO (> 1: OpenVINO faster), and the load average before and after
(the runs share the machine). The last columns: OpenVINO at the CPU plugin's own precision
(bfloat16 on CPUs with AMX or AVX512-BF16), which `export` does not use, and the largest logit
difference that makes against float32. Weights are random: speed does not depend on them.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import openvino
import torch

from project.deploy.classifier import open_session
from project.deploy.openvino_runtime import OpenVINOSession
from project.export.deployable import Deployable
from project.export.onnx_target import write_torchscript
from project.export.openvino_target import write_ir
from project.model import ImageClassifier

CASES = [("mobilenet_v3_small", 64), ("resnet18", 224)]
BATCHES = (1, 8)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(sessions: dict[str, object], images: np.ndarray, reps: int, block: int = 5) -> dict[str, float]:
    """Median milliseconds per runtime over `reps` runs each, in alternating blocks of `block` runs.

    Blocks, not single runs: onnxruntime's threads spin for a while after each run and take the
    cores from whatever runs next (OpenVINO right after it measured up to 10x slower), which a
    service running one runtime never sees. The first run of each block is left out for the same
    reason; alternating the blocks still spreads drift in the machine's load over both.
    """
    runs = {
        name: (lambda s=session: s.run(["logits"], {"images": images})) for name, session in sessions.items()
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    while min(map(len, times.values())) < reps:
        for name, run in runs.items():
            run()  # after the other runtime: left out
            times[name] += [timed(run) for _ in range(block)]
    return {name: statistics.median(t[:reps]) * 1e3 for name, t in times.items()}


class PluginPrecision(OpenVINOSession):
    """The IR compiled at the CPU plugin's default inference precision (bfloat16 where the CPU has it)."""

    def __init__(self, xml: Path, threads: int) -> None:
        super().__init__(xml, threads)
        self.compiled = openvino.Core().compile_model(str(xml), "CPU", {"INFERENCE_NUM_THREADS": threads})
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for each runtime")
    parser.add_argument("--reps", type=int, default=30, help="timed runs of each runtime per case")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} threads each; "
        f"onnxruntime {ort.__version__}, openvino {openvino.get_version()}, torch {torch.__version__}"
    )
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    columns = "onnxruntime ms | OpenVINO ms | onnxruntime / OpenVINO | plugin precision ms | its logit diff"
    print(f"| model | batch | {columns} |\n| --- | --- | --- | --- | --- | --- | --- |")
    for backbone, size in CASES:
        model = Deployable(ImageClassifier(num_classes=10, backbone=backbone, scheduler=None)).eval()
        with tempfile.TemporaryDirectory() as tmp:
            onnx_path = Path(tmp) / "model.onnx"
            xml = onnx_path.with_suffix(".xml")
            assert write_torchscript(model, size, onnx_path, opset=18)  # export's first choice
            write_ir(onnx_path, xml, xml.with_suffix(".bin"))
            sessions = {
                "onnxruntime": open_session(onnx_path, args.threads),
                "openvino": open_session(xml, args.threads),
                "plugin": PluginPrecision(xml, args.threads),
            }
        for batch in BATCHES:
            print(row(f"{backbone} {size}px", batch, sessions, size, args.reps))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def row(name: str, batch: int, sessions: dict[str, object], size: int, reps: int) -> str:
    images = np.random.default_rng(batch).integers(0, 256, (batch, 3, size, size), dtype=np.uint8)
    ms = compare(sessions, images, reps)
    f32, plugin = (sessions[n].run(["logits"], {"images": images})[0] for n in ("openvino", "plugin"))
    return (
        f"| {name} | {batch} | {ms['onnxruntime']:.2f} | {ms['openvino']:.2f} | "
        f"{ms['onnxruntime'] / ms['openvino']:.2f} | {ms['plugin']:.2f} ({sessions['plugin'].precision}) | "
        f"{np.abs(plugin - f32).max():.1e} of {np.abs(f32).max():.2g} |"
    )


if __name__ == "__main__":
    main()
