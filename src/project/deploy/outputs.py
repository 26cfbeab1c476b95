"""A model's outputs as every path reads them, and their probabilities: numpy only.

`predict` (Lightning), `infer` (onnxruntime) and `serve` turn logits into probabilities with `softmax`,
so the three agree to float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class Outputs(NamedTuple):
    """A model's outputs for a batch: logits [N, C], and penultimate features [N, D] where it has them."""

    logits: np.ndarray
    features: np.ndarray | None = None

    @classmethod
    def of(cls, names: Sequence[str], values: Sequence[np.ndarray]) -> Outputs:
        """The outputs of a session run on `names` (`logits`, optionally `features`)."""
        found = dict(zip(names, values, strict=True))
        return cls(found["logits"], found.get("features"))


def softmax(
    logits: np.ndarray,
    temperature: float = 1.0,  # room: calibration
) -> np.ndarray:
    """Probabilities [N, C] of logits [N, C] (float64).

    # room: calibration begin
    At `temperature`: the logits are divided by it first (`project.deploy.calibration`).
    # room: calibration end
    """
    scaled = np.array(logits, dtype=np.float64)  # a copy: scaled in place below
    scaled /= temperature  # room: calibration
    exp = np.exp(scaled - scaled.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)
