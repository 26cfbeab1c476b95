"""Exact and near-duplicate pairs: identical bytes, or close perceptual hashes and colours (and embeddings).

A pair whose two files sit in different splits (train/val/test) is a leak: the evaluation sees an
image the model trained on. Pairs are found block by block, so memory stays O(block x N).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

BLOCK = 512
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Pair:
    """Images a < b (positions), how alike they are, and whether they straddle two splits."""

    a: int
    b: int
    kind: str  # exact (same bytes) or near
    similarity: float  # mean cosine similarity of the fold models' embeddings (1.0 for exact copies)
    hash_distance: int  # differing bits of the 64-bit perceptual hash
    color_distance: float  # mean absolute difference of the 8x8 colour thumbnails, in levels of 255
    leak: bool


@dataclass(frozen=True)
class Thresholds:
    """When two images count as near duplicates (see find_duplicates)."""

    hash_distance: int = 16
    color_distance: float = 10.0
    similarity: float = 0.98


def joint_embedding(per_model: list[np.ndarray]) -> np.ndarray:
    """Unit rows whose dot product is the mean cosine similarity over the fold models' embedding spaces."""
    parts = [e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12) for e in per_model]
    return (np.concatenate(parts, axis=1) / np.sqrt(len(parts))).astype(np.float32)


def find_duplicates(
    digests: list[str],
    hashes: np.ndarray,
    thumbs: np.ndarray,
    embedding: np.ndarray | None,
    splits: np.ndarray,
    thresholds: Thresholds,
) -> list[Pair]:
    """Every pair with the same bytes, or near by `thresholds`; exact pairs first, then most alike first.

    Near: perceptual hashes at most `hash_distance` bits apart and colour thumbnails at most
    `color_distance` apart; or thumbnails up to twice that apart when the embeddings are at least
    `similarity` alike. On the benchmark's planted copies (docs/benchmarks.md): resized and
    recompressed copies keep their hash (0-4 bits of 64) and colours (<= 2 levels); a 6% crop moves
    2-22 bits and 3-18 levels; different pictures come as close in hash (grayscale shapes do) but not
    in colour. Embeddings alone do not separate: a short run from scratch maps different pictures of
    one class as close as copies, so they only vouch for crops whose colours moved.
    """
    signs = np.where(hashes, 1.0, -1.0).astype(np.float32)
    bits = hashes.shape[1]
    found: dict[tuple[int, int], Pair] = {}
    for start in range(0, len(digests), BLOCK):
        rows = np.arange(start, min(start + BLOCK, len(digests)))
        distance = np.rint((bits - signs[rows] @ signs.T) / 2).astype(np.int64)
        r, b = np.nonzero(distance <= thresholds.hash_distance)
        a = rows[r]
        a, b, r = a[a < b], b[a < b], r[a < b]
        colour = np.abs(thumbs[a] - thumbs[b]).mean(axis=1)
        cosine = (
            np.einsum("ij,ij->i", embedding[a], embedding[b]) if embedding is not None else np.zeros(len(a))
        )
        near = (colour <= thresholds.color_distance) | (
            (colour <= 2 * thresholds.color_distance) & (cosine >= thresholds.similarity)
        )
        for i in np.flatnonzero(near):
            pair = Pair(int(a[i]), int(b[i]), "near", float(cosine[i]), int(distance[r[i], b[i]]),
                        float(colour[i]), _leak(splits, int(a[i]), int(b[i])))  # fmt: skip
            found[(pair.a, pair.b)] = pair
    same_bytes = defaultdict(list)
    for i, digest in enumerate(digests):
        same_bytes[digest].append(i)
    for group in same_bytes.values():
        for x, a in enumerate(group):
            for b in group[x + 1 :]:
                found[(a, b)] = Pair(a, b, "exact", 1.0, 0, 0.0, _leak(splits, a, b))
    return sorted(found.values(), key=lambda p: (p.kind != "exact", p.hash_distance, p.color_distance))


def _leak(splits: np.ndarray, a: int, b: int) -> bool:
    return splits[a] != splits[b] and splits[a] in SPLITS and splits[b] in SPLITS
