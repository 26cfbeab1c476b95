"""The .pt2 target: the torch.export program, saved and loaded by torch itself."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from project.export.targets import Runner, Source


def write(source: Source, path: Path) -> bool:
    with open(path, "wb") as f:
        torch.export.save(source.program, f)
    return True


def load(path: Path) -> Runner:
    """The program reloaded from `path`, as a user of the .pt2 would load it."""
    with open(path, "rb") as f:
        module = torch.export.load(f).module()

    def run(images: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(images)).numpy()

    return run
