"""Calibrated probabilities from a model's outputs: numpy only, shared by all paths.

`predict` (Lightning), `infer` (onnxruntime) and `serve` turn outputs into answers through this
module with the values `export` wrote into the sidecar, so the three agree to float rounding:
probabilities are softmax(logits / temperature), the temperature fitted on the validation split.
# room: unknown begin

An image whose unknown score (`project.deploy.unknown`) is below the sidecar's `unknown_threshold`
is answered `unknown` (its class probabilities are still reported). `Calibration.reason` says in one
sentence why (which score, its value against the threshold, and the share of validation images the
threshold accepts): every output carries it, so that a high probability answered `unknown` does not
read as a bug.
# room: unknown end
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# room: unknown begin
from project.deploy.feature_bank import FeatureBank

# room: unknown end
from project.deploy.outputs import (
    Outputs,  # room: unknown
    softmax,
)

# room: unknown begin
from project.deploy.unknown import FEATURE_SCORES, score, threshold_for

# room: unknown end


@dataclass(frozen=True)
class Calibration:
    """What the sidecar says about turning outputs into answers (identity for an uncalibrated export)."""

    temperature: float = 1.0
    # room: unknown begin
    score_name: str = "energy"
    threshold: float | None = None  # None: no image is answered unknown
    accept: float | None = None  # the share of validation images the threshold accepts, when known
    bank: FeatureBank | None = None  # the training images' features, for the knn score
    # room: unknown end

    @classmethod
    def from_sidecar(
        cls,
        meta: Mapping,
        # room: unknown begin
        accept: float | None = None,
        bank: FeatureBank | None = None,
        # room: unknown end
    ) -> Calibration:
        """The sidecar's calibration: its temperature.

        # room: unknown begin
        And its unknown rule: `accept` (0 turns rejection off) overrides its share, and `bank` serves the
        knn score.
        # room: unknown end
        """
        given: dict = {"temperature": float(meta.get("temperature") or 1.0)}
        given |= unknown_rule(meta, accept, bank)  # room: unknown
        return cls(**given)

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        return softmax(logits, self.temperature)

    # room: unknown begin
    @property
    def needs_features(self) -> bool:
        """Whether the verdict needs the model's features (a feature-space score with a threshold)."""
        return self.threshold is not None and self.score_name in FEATURE_SCORES

    def scores(self, logits: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        return score(logits, self.score_name, self.temperature, features, self.bank)

    def verdict(self, outputs: Outputs) -> tuple[np.ndarray, np.ndarray | None]:
        """(bool [N]: answered `unknown`, the unknown scores [N] or None when no threshold applies)."""
        if self.threshold is None:
            return np.zeros(len(outputs.logits), dtype=bool), None
        scores = self.scores(*outputs)
        return scores < self.threshold, scores

    def known(self, logits: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        """bool [N]: True where the image is answered with a class, False where `unknown`."""
        if self.threshold is None:
            return np.ones(len(logits), dtype=bool)
        return self.scores(logits, features) >= self.threshold

    def reason(self, score: float) -> str:
        """Why an image whose unknown score is `score` is answered `unknown`; "" when it is not."""
        if self.threshold is None or score >= self.threshold:
            return ""
        said = f"{self.score_name} score {score:.4f} is {self.threshold - score:.4f} below"
        if self.accept is None:
            return f"{said} the export's threshold {self.threshold:.4f}"
        return (
            f"{said} the threshold {self.threshold:.4f}, which accepts {self.accept:.0%} "
            "of the validation images"
        )

    # room: unknown end


# room: unknown begin
def unknown_rule(meta: Mapping, accept: float | None = None, bank: FeatureBank | None = None) -> dict:
    """The sidecar's unknown rule, as Calibration's fields; `accept` (0 turns rejection off) overrides its
    share, and `bank` serves the knn score."""
    name = str(meta.get("unknown_score") or "energy")
    threshold = meta.get("unknown_threshold")
    table = meta.get("unknown_quantiles")
    if accept is not None:
        threshold = threshold_for(table, accept) if accept > 0 and table else None
    else:
        accept = meta.get("unknown_accept")
    if threshold is None:
        return {"score_name": name}
    return {"score_name": name, "threshold": float(threshold), "accept": _float_or_none(accept), "bank": bank}


def _float_or_none(value: object) -> float | None:
    return None if value is None else float(value)


# room: unknown end
