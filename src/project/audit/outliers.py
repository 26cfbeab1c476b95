"""Outliers: images whose embedding is far from every training image of their fold (cleanlab's kNN score).

Each fold's model embeds its own training images and the held-out ones; cleanlab's OutOfDistribution
fits the training embeddings and scores the held-out ones. Scores of different models are not on one
scale, so each is turned into a percentile: the share of that fold's training images that are less
typical than this image. A percentile near 0 means it resembles nothing the model learned from.
"""

from __future__ import annotations

import warnings

import numpy as np


def outlier_percentiles(all_embeddings: list[np.ndarray], fold_of: np.ndarray) -> np.ndarray:
    """[N] in [0, 1]: per image, the share of its fold's training images less typical than it."""
    from cleanlab.outlier import OutOfDistribution  # imports scikit-learn: only here

    percentile = np.ones(len(fold_of), dtype=np.float64)
    for k, features in enumerate(all_embeddings):
        train, held_out = np.flatnonzero(fold_of != k), np.flatnonzero(fold_of == k)
        neighbours = min(10, len(train) - 1)
        if neighbours < 1:
            continue
        ood = OutOfDistribution({"k": neighbours})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reference = np.sort(ood.fit_score(features=features[train], verbose=False))
            scores = ood.score(features=features[held_out])
        percentile[held_out] = np.searchsorted(reference, scores, side="left") / len(reference)
    return percentile
