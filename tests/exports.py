"""Tiny exports for the tests of what runs them (infer, serve, the Python API, the serving install).

Each is a hand-built ONNX graph with the export contract (uint8 images [N, 3, H, W] in, logits out, a
sidecar beside it): mean colour -> linear layer, so that answers differ per image and build in
milliseconds instead of a torch export's half minute. Torch-free, as the code under test.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

CLASSES = ["red", "green", "blue", "dark"]


SRC = str(Path(__file__).parents[1] / "src")  # the code under test, also where it is not installed


SIZE = 16


def tiny_export(folder: Path, stem: str, seed: int) -> Path:
    """`<stem>.onnx` + `<stem>.json` as export writes them: mean colour -> logits of CLASSES."""
    weights = np.eye(3, len(CLASSES), dtype=np.float32) * 0.05
    weights[:, 3] = -0.05  # "dark": high when every channel is low
    weights += np.random.default_rng(seed).normal(0, 0.01, weights.shape).astype(np.float32)
    bias = np.array([0, 0, 0, 6], dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["images"], ["x"], to=TensorProto.FLOAT),
            helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=0),
            helper.make_node("MatMul", ["mean", "w"], ["wx"]),
            helper.make_node("Add", ["wx", "b"], ["logits"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("images", TensorProto.UINT8, ["N", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", len(CLASSES)])],
        [
            numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "axes"),
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(bias, "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9  # readable by older onnxruntime releases too
    onnx.save(model, folder / f"{stem}.onnx")
    sidecar = {
        "class_names": CLASSES,
        "image_size": SIZE,
        "task": "multiclass",
        "preprocessing": {"crop_ratio": 0.875},
        "files": {"onnx": f"{stem}.onnx"},
        "source_checkpoint": {"path": f"/secret/runs/{stem}/last.ckpt", "sha256": "0" * 64},
    }
    (folder / f"{stem}.json").write_text(json.dumps(sidecar))
    return folder / f"{stem}.onnx"


def point_latest(folder: Path, stem: str) -> None:
    """Repoint latest.onnx/.json as export does (atomic_symlink), without importing torch here."""
    for ext in ("onnx", "json"):
        staging = folder / f".latest.{ext}.new"
        staging.unlink(missing_ok=True)
        staging.symlink_to(f"{stem}.{ext}")
        os.replace(staging, folder / f"latest.{ext}")


def with_unknown_keys(
    export: Path, lowest: float, highest: float, class_names: list[str] | None = None
) -> None:
    """Rename the classes of `export`'s sidecar to `class_names` (None: keep them).

    And give it a temperature of 1.  # room: calibration

    # room: unknown begin
    And the unknown keys export writes: validation energy scores spread evenly from `lowest` to
    `highest`, the threshold accepting 95% of them.
    # room: unknown end
    """
    sidecar = export.with_suffix(".json")
    meta = json.loads(sidecar.read_text())
    table = np.linspace(lowest, highest, 101).tolist()  # room: unknown
    meta["temperature"] = 1.0  # room: calibration
    meta |= {"unknown_score": "energy", "unknown_quantiles": table}  # room: unknown
    meta |= {"unknown_accept": 0.95, "unknown_threshold": lowest + 0.05 * (highest - lowest)}  # room: unknown
    if class_names is not None:
        meta["class_names"] = class_names
    sidecar.write_text(json.dumps(meta))


def encode(img: Image.Image, fmt: str = "JPEG", **options: object) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **options)
    return buffer.getvalue()


def infer(*args: str | bytes, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m project infer ARGS` in a subprocess; fails the test if it imported torch."""
    probe = (
        "import atexit, runpy, sys; sys.argv = ['project', 'infer'] + sys.argv[1:]\n"
        "atexit.register(lambda: 'torch' in sys.modules and print('imported torch', file=sys.stderr))\n"
        "runpy.run_module('project', run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", probe, *args]
    result = subprocess.run(command, capture_output=True, env=env, timeout=120, cwd=cwd)
    assert b"imported torch" not in result.stderr
    return result


DOC = {
    "version": 1,
    "class_names": ["red", "green", "blue", "dark"],
    "image_size": 16,
    "task": "multiclass",
    "input": {"name": "images", "shape": ["N", 3, 16, 16], "dtype": "uint8", "layout": "NCHW, RGB"},
    "preprocessing": {"crop_ratio": 0.875, "normalization": {"mean": [0.5] * 3, "std": [0.25] * 3}},
    "source_checkpoint": {"path": "/runs/x/last.ckpt", "sha256": "0" * 64},
    # room: calibration begin
    "temperature": 1.5,
    "ece_before": 0.1,
    "ece_after": 0.05,
    "calibration_images": 24,
    "reliability": {
        "bins": 2,
        "before": {"confidence": [0.3, 0.8], "accuracy": [0.25, 0.9], "count": [10, 14]},
        "after": {"confidence": [0.35, 0.75], "accuracy": [0.25, 0.9], "count": [11, 13]},
    },
    # room: calibration end
    "unknown_score": "energy",  # room: unknown
    "unknown_accept": 0.95,  # room: unknown
    "unknown_quantiles": [float(q) for q in range(101)],  # room: unknown
    "unknown_threshold": 5.0,  # room: unknown
    "files": {"onnx": "m.onnx", "pt2": "m.pt2"},
    "verification": {"passed": True},
}
