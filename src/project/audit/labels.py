"""Label issues: confident learning (cleanlab) on out-of-fold probabilities, most likely wrong first."""

from __future__ import annotations

import warnings
from collections.abc import Callable  # room: multilabel
from dataclasses import dataclass

import numpy as np


@dataclass
class LabelIssues:
    """Every image's label quality (low: the given label is doubtful) and the flagged ones, ranked."""

    quality: np.ndarray  # [N] in [0, 1]
    ranked: np.ndarray  # positions of the flagged images, most likely wrong first
    suggested: list[list[int]]  # per image: the suggested classes (one for multi-class data)


def find_label_issues(
    labels: np.ndarray,
    probabilities: np.ndarray,
    threshold: float = 0.5,  # room: multilabel
) -> LabelIssues:
    """cleanlab's find_label_issues and label-quality scores; `labels` is [N] classes.
    # room: multilabel begin

    Or [N, C] multi-hot: the classes suggested are then those with a probability at least `threshold`.
    # room: multilabel end
    """
    from cleanlab.filter import find_label_issues as cleanlab_issues  # imports scikit-learn: only here

    # n_jobs=1: cleanlab's default forks a process pool from this process, which holds torch's and the
    # loaders' threads by now; a fork that copies a lock another thread held hangs the audit for good
    # (seen: a pool worker waiting forever on its queue's lock). Its results do not depend on n_jobs.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cleanlab warns about classes with few images: the folds said so
        # room: multilabel begin
        if labels.ndim == 2:
            return multi_label_issues(labels, probabilities, threshold, cleanlab_issues)
        # room: multilabel end
        from cleanlab.rank import get_label_quality_scores

        ranked = cleanlab_issues(labels, probabilities, return_indices_ranked_by="self_confidence", n_jobs=1)
        quality = get_label_quality_scores(labels, probabilities, method="self_confidence")
        suggested = [[int(c)] for c in probabilities.argmax(axis=1)]
    return LabelIssues(np.asarray(quality, dtype=np.float64), np.asarray(ranked, dtype=np.int64), suggested)


# room: multilabel begin
def multi_label_issues(
    labels: np.ndarray, probabilities: np.ndarray, threshold: float, cleanlab_issues: Callable
) -> LabelIssues:
    """cleanlab's multi-label mode for [N, C] multi-hot labels: the classes suggested are those with a
    probability at least `threshold`."""
    from cleanlab.multilabel_classification.rank import get_label_quality_scores

    given = [np.flatnonzero(row).tolist() for row in labels]
    ranked = cleanlab_issues(
        given, probabilities, multi_label=True, return_indices_ranked_by="self_confidence", n_jobs=1
    )
    quality = get_label_quality_scores(given, probabilities)
    suggested = [np.flatnonzero(p >= threshold).tolist() for p in probabilities]
    return LabelIssues(np.asarray(quality, dtype=np.float64), np.asarray(ranked, dtype=np.int64), suggested)


# room: multilabel end
