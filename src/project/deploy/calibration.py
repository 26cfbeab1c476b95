"""Calibrated probabilities and the `unknown` answer from a model's outputs: numpy only, shared by all paths.

`predict` (Lightning), `infer` (onnxruntime) and `serve` turn outputs into answers through this
module with the values `export` wrote into the sidecar, so the three agree to float rounding:

- probabilities: softmax(logits / temperature), the temperature fitted on the validation split;
- the unknown score, higher meaning "more like the training classes": `knn` the cosine similarity
  of the image's penultimate features to the 5th nearest training image's
  (`project.deploy.feature_bank`), `energy` T * logsumexp(logits / T) (the negative free energy),
  `max_probability` the top calibrated probability. `export` measures each on the validation split
  and on foreign images it makes (`project.export.foreign`) and keeps the one that answers most of
  those `unknown`, saying why in the sidecar;
- the rule: an image whose score is below `unknown_threshold` is answered `unknown` (its class
  probabilities are still reported). The threshold accepts the share `unknown_accept` of the
  validation images; `unknown_quantiles` (the validation scores at shares 0, 1, ..., 100 %) let
  a command choose another share without the data.

`Calibration.reason` says in one sentence why an image is `unknown` (which score, its value against
the threshold, and the share of validation images the threshold accepts): every output carries it, so
that a high probability answered `unknown` does not read as a bug.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from project.deploy.feature_bank import FeatureBank

UNKNOWN = "unknown"
SCORES = ("knn", "energy", "max_probability")  # the order of preference where they measure alike
FEATURE_SCORES = ("knn",)  # computed from the features, so only for an export that outputs them
DEFAULT_ACCEPT = 0.95


class Outputs(NamedTuple):
    """A model's outputs for a batch: logits [N, C], and penultimate features [N, D] where it has them."""

    logits: np.ndarray
    features: np.ndarray | None = None

    @classmethod
    def of(cls, names: Sequence[str], values: Sequence[np.ndarray]) -> Outputs:
        """The outputs of a session run on `names` (`logits`, optionally `features`)."""
        found = dict(zip(names, values, strict=True))
        return cls(found["logits"], found.get("features"))


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Probabilities [N, C] of logits [N, C] at `temperature`."""
    scaled = np.asarray(logits, dtype=np.float64) / temperature
    exp = np.exp(scaled - scaled.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def score(
    logits: np.ndarray,
    name: str,
    temperature: float = 1.0,
    features: np.ndarray | None = None,
    bank: FeatureBank | None = None,
) -> np.ndarray:
    """The unknown score [N] of each image: higher means more like the training classes."""
    if name == "max_probability":
        return softmax(logits, temperature).max(axis=1)
    if name == "energy":
        scaled = np.asarray(logits, dtype=np.float64) / temperature
        top = scaled.max(axis=1)
        return temperature * (top + np.log(np.exp(scaled - top[:, None]).sum(axis=1)))
    if name == "knn":
        if features is None or bank is None:
            raise ValueError("the knn score needs the model's features and the export's feature bank")
        return bank.scores(features)
    raise ValueError(f"unknown score {name!r}: expected one of {SCORES}")


def quantiles(scores: np.ndarray) -> list[float]:
    """The scores at shares 0, 1, ..., 100 % of `scores` (what a threshold for any share needs)."""
    return [float(q) for q in np.quantile(np.asarray(scores, dtype=np.float64), np.linspace(0, 1, 101))]


def threshold_for(table: list[float], accept: float) -> float:
    """The score that accepts the share `accept` of the images `table` (from `quantiles`) describes."""
    return float(np.interp(1.0 - accept, np.linspace(0, 1, len(table)), table))


@dataclass(frozen=True)
class Calibration:
    """What the sidecar says about turning outputs into answers (identity for an uncalibrated export)."""

    temperature: float = 1.0
    score_name: str = "energy"
    threshold: float | None = None  # None: no image is answered unknown
    accept: float | None = None  # the share of validation images the threshold accepts, when known
    bank: FeatureBank | None = None  # the training images' features, for the knn score

    @classmethod
    def from_sidecar(
        cls, meta: Mapping, accept: float | None = None, bank: FeatureBank | None = None
    ) -> Calibration:
        """The sidecar's calibration; `accept` (0 turns rejection off) overrides its share."""
        temperature = float(meta.get("temperature") or 1.0)
        name = str(meta.get("unknown_score") or "energy")
        threshold = meta.get("unknown_threshold")
        table = meta.get("unknown_quantiles")
        if accept is not None:
            threshold = threshold_for(table, accept) if accept > 0 and table else None
        else:
            accept = meta.get("unknown_accept")
        if threshold is None:
            return cls(temperature, name)
        return cls(temperature, name, float(threshold), None if accept is None else float(accept), bank)

    @property
    def needs_features(self) -> bool:
        """Whether the verdict needs the model's features (a feature-space score with a threshold)."""
        return self.threshold is not None and self.score_name in FEATURE_SCORES

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        return softmax(logits, self.temperature)

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
