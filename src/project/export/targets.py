"""The export targets, in one table: how each file is written, and loaded to run (so verified).

`export` writes every target of TARGETS next to the checkpoint (`<run>-<metric>-<time>.<name>`),
verifies each against the PyTorch model on the same images (`project.export.verify`), and names
them in the sidecar's `files`. A new target is a module with its writers and its loader, plus one
row here (docs/new-task.md, "an export target").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from project.export import onnx_target, pt2_target

# uint8 images [N, 3, H, W] -> float logits [N, C], numpy in and out: a loaded export, ready to run
Runner = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Source:
    """What a target is written from.

    Args:
        model: uint8 images -> logits (`project.export.deployable.Deployable`), in eval mode.
        program: `model` through torch.export, dynamic batch.
        size: The image size the model takes.
        opset: The ONNX opset asked for.
        files: The verified files of the targets written before, by name (in TARGETS' order), for a
            target converted from another's file.
    """

    model: nn.Module
    program: torch.export.ExportedProgram
    size: int
    opset: int
    files: dict[str, Path] = field(default_factory=dict)


# write(source, path): False where this writer cannot write the model (the next one is tried)
Writer = Callable[[Source, Path], bool]


@dataclass(frozen=True)
class Target:
    """One export format.

    Args:
        name: The file's suffix and its key in the sidecar's `files` (`onnx`).
        runtime: What runs the file; names its results in the sidecar's `verification`.
        writers: The ways to write the file, by name, tried in order until one writes a file that
            passes verification. With more than one, the sidecar says which under `<name>_exporter`.
        load: The file -> a Runner.
    """

    name: str
    runtime: str
    writers: Mapping[str, Writer]
    load: Callable[[Path], Runner]


TARGETS: dict[str, Target] = {
    target.name: target
    for target in (
        Target(
            "onnx",
            "onnxruntime",
            {"torchscript": onnx_target.torchscript, "torch.export": onnx_target.torch_export},
            onnx_target.load,
        ),
        Target("pt2", "pt2", {"torch.export": pt2_target.write}, pt2_target.load),
    )
}
