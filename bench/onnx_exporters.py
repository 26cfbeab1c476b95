"""The two ONNX exporters: export time, and onnxruntime latency of the graphs they write.

    python bench/onnx_exporters.py [--rounds 3] [--runs 40]

For each network (random weights, the exported module `Deployable`: uint8 in, logits out):
- export time: `onnx_target.write_torchscript` (what `export_checkpoint` tries first) against
  `onnx_target.write_torch_export` from the torch.export program (its fallback), alternating `--rounds` times
  in this process (the first round of each includes its one-time costs, as in a fit's single
  export; the median is printed and the first round separately);
- latency: both files in onnxruntime (CPU, 2 threads), batch 1 and 32, `--runs` runs alternating
  the two sessions (10 at batch 32), medians; and the largest |logit difference| between them.
Prints one table row per network and batch.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from project.export.deployable import Deployable, dynamic_batch, example_batch
from project.export.onnx_target import write_torch_export, write_torchscript
from project.model import ImageClassifier

NETWORKS = (("mobilenet_v3_small", 64), ("resnet18", 32), ("resnet18", 224))


def timed(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def dynamo_export(model: torch.nn.Module, size: int, path: Path) -> None:
    program = torch.export.export(model, (example_batch(size),), dynamic_shapes=dynamic_batch())
    write_torch_export(program, size, path, 18)


def export_seconds(model: torch.nn.Module, size: int, paths: dict[str, Path], rounds: int) -> dict[str, list]:
    writers = {
        "torch.export": dynamo_export,
        "torchscript": lambda m, s, p: write_torchscript(m, s, p, 18),
    }
    seconds: dict[str, list[float]] = {k: [] for k in writers}
    for r in range(rounds):
        for k in list(writers)[:: 1 if r % 2 == 0 else -1]:
            seconds[k].append(timed(writers[k], model, size, paths[k]))
    return seconds


def latencies(paths: dict[str, Path], size: int, runs: int) -> tuple[dict[int, dict[str, float]], float]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    sessions = {
        k: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for k, p in paths.items()
    }
    latency, diff = {}, 0.0
    for batch in (1, 32):
        feed = {
            "images": np.random.default_rng(batch).integers(0, 256, (batch, 3, size, size), dtype=np.uint8)
        }
        outputs = {k: s.run(None, feed)[0] for k, s in sessions.items()}  # also a warm-up
        diff = max(diff, float(np.abs(outputs["torch.export"] - outputs["torchscript"]).max()))
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for r in range(runs if batch == 1 else max(4, runs // 4)):
            for k in list(sessions)[:: 1 if r % 2 == 0 else -1]:
                times[k].append(timed(sessions[k].run, None, feed))
        latency[batch] = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return latency, diff


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}")
    print(
        "| network | export s: torch.export-based | TorchScript | latency ms, batch 1 | batch 32 | max diff |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name, size in NETWORKS:
            torch.manual_seed(0)
            model = Deployable(ImageClassifier(num_classes=10, backbone=name, image_size=size)).eval()
            paths = {k: Path(tmp) / f"{name}-{size}-{k}.onnx" for k in ("torch.export", "torchscript")}
            seconds = export_seconds(model, size, paths, args.rounds)
            latency, diff = latencies(paths, size, args.runs)
            a, b = (statistics.median(v) for v in seconds.values())
            first = f"first {seconds['torch.export'][0]:.2f} / {seconds['torchscript'][0]:.2f}"
            cells = [f"{latency[n]['torch.export']:.2f} / {latency[n]['torchscript']:.2f}" for n in (1, 32)]
            row = [f"{name} {size} px", f"{a:.2f}", f"{b:.2f} ({a / b:.1f}x; {first})", *cells, f"{diff:.1e}"]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
