"""The .pt2 target: the torch.export program, saved and loaded by torch itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from project.deploy.outputs import Outputs

if TYPE_CHECKING:
    from project.export.target import Files, Runner, Source


def write(source: Source, files: Files) -> bool:
    with open(files["pt2"], "wb") as f:
        torch.export.save(source.program, f)
    return True


def load(files: Files) -> Runner:
    """The program reloaded from the file, as a user of the .pt2 would load it."""
    with open(files["pt2"], "rb") as f:
        module = torch.export.load(f).module()

    def run(images: np.ndarray) -> Outputs:
        with torch.no_grad():
            out = module(torch.from_numpy(images))
        values = out if isinstance(out, (tuple, list)) else (out,)
        return Outputs(*(v.numpy() for v in values))

    return run
