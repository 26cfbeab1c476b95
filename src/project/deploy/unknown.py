"""The unknown score and its threshold: numpy only, shared by `export`, which fits them, and every reader.

- the score, higher meaning "more like the training classes": `knn` the cosine similarity of the
  image's penultimate features to the 5th nearest training image's (`project.deploy.feature_bank`),
  `energy` T * logsumexp(logits / T) (the negative free energy), `max_probability` the top calibrated
  probability. `export` measures each on the validation split and on foreign images it makes
  (`project.export.foreign`) and keeps the one that answers most of those `unknown`, saying why in the
  sidecar (`project.export.fit_unknown`);
- the rule: an image whose score is below `unknown_threshold` is answered `unknown` (its class
  probabilities are still reported). The threshold accepts the share `unknown_accept` of the
  validation images; `unknown_quantiles` (the validation scores at shares 0, 1, ..., 100 %) let
  a command choose another share without the data.

`project.deploy.calibration.Calibration` applies the rule with the sidecar's values, so that `predict`,
`infer` and `serve` give every image the same verdict.
"""

from __future__ import annotations

import numpy as np

from project.deploy.feature_bank import FeatureBank

UNKNOWN = "unknown"
SCORES = ("knn", "energy", "max_probability")  # the order of preference where they measure alike
FEATURE_SCORES = ("knn",)  # computed from the features, so only for an export that outputs them
DEFAULT_ACCEPT = 0.95


def score(
    logits: np.ndarray,
    name: str,
    temperature: float = 1.0,
    features: np.ndarray | None = None,
    bank: FeatureBank | None = None,
) -> np.ndarray:
    """The unknown score [N] of each image: higher means more like the training classes."""
    if name in ("max_probability", "energy"):
        scaled = np.asarray(logits, dtype=np.float64) / temperature
        top = scaled.max(axis=1)
        total = np.exp(scaled - top[:, None]).sum(axis=1)
        if name == "max_probability":  # the top calibrated probability: its class's term is exp(0) = 1
            return 1.0 / total
        return temperature * (top + np.log(total))
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
