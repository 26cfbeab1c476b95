"""What an export target is: the files it writes, how they are written from the model, how they are
loaded to run. The targets themselves (ONNX, .pt2, OpenVINO) are rows of project.export.targets; their
modules import these types from here, so nothing imports the table back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from project.deploy.outputs import Outputs

# uint8 images [N, 3, H, W] -> float logits [N, C] (and features [N, D] where the model outputs them),
# numpy in and out: a loaded export, ready to run
Runner = Callable[[np.ndarray], Outputs]
# a target's files by suffix (`onnx`; `bin` and `xml`)
Files = Mapping[str, Path]
VERIFY_FIX = "check that the backbone exports cleanly (torch.export) or try another --opset."


@dataclass(frozen=True)
class Source:
    """What a target is written from.

    Args:
        model: uint8 images -> logits and features (`project.export.deployable.Deployable`), in eval mode.
        program: `model` through torch.export, dynamic batch.
        size: The image size the model takes.
        opset: The ONNX opset asked for.
        files: The main file of each target written (and verified) before, by name, in TARGETS'
            order: a target converted from another's file (OpenVINO from the ONNX file) reads it here.
    """

    model: nn.Module
    program: torch.export.ExportedProgram
    size: int
    opset: int
    files: dict[str, Path] = field(default_factory=dict)


# write(source, files): False where this writer cannot write the model (the next one is tried)
Writer = Callable[[Source, Files], bool]


@dataclass(frozen=True)
class Target:
    """One export format.

    Args:
        name: Its key in the sidecar's `files` (and its `--format` value when optional).
        runtime: What runs its files; names its results in the sidecar's `verification`.
        writers: The ways to write its files, by name, tried in order until one writes files that
            pass verification. With more than one, the sidecar says which under `<name>_exporter`.
        load: Its files -> a Runner.
        suffixes: The files it writes, renamed into place in this order; the last is its main file,
            the one the sidecar names and infer/serve open. Default: one file, `.<name>`.
        optional: Written only when `--format` names it; else with every export.
        require: Raises UserError where it cannot be written on this machine (a missing package);
            called before any work.
        version: The version of what writes it, recorded in the sidecar's `versions`.
        fix: What to try when its files fail verification.
    """

    name: str
    runtime: str
    writers: Mapping[str, Writer]
    load: Callable[[Files], Runner]
    suffixes: tuple[str, ...] = ()
    optional: bool = False
    require: Callable[[], None] | None = None
    version: Callable[[], str] | None = None
    fix: str = VERIFY_FIX

    @property
    def files(self) -> tuple[str, ...]:
        return self.suffixes or (self.name,)

    @property
    def main(self) -> str:
        """The suffix of its main file."""
        return self.files[-1]
