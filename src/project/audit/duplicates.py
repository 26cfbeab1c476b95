"""Exact and near-duplicate pairs: identical bytes, or a close perceptual hash, or nearly equal embeddings.

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
    similarity: float  # mean cosine similarity of the embeddings (1.0 for exact copies)
    hash_distance: int  # differing bits of the 64-bit perceptual hash
    leak: bool


def joint_embedding(per_model: list[np.ndarray]) -> np.ndarray:
    """Unit rows whose dot product is the mean cosine similarity over the fold models' embedding spaces."""
    parts = [e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12) for e in per_model]
    return (np.concatenate(parts, axis=1) / np.sqrt(len(parts))).astype(np.float32)


def find_duplicates(
    digests: list[str],
    hashes: np.ndarray,
    embedding: np.ndarray | None,
    splits: np.ndarray,
    hash_distance: int,
    similarity: float,
) -> list[Pair]:
    """Every pair with the same bytes; or hashes at most `hash_distance` bits apart; or at most twice that
    with embeddings at least `similarity` alike. Exact pairs first, then most alike first.

    Resized and recompressed copies keep their hash (0-2 bits of 64 on the benchmark), while different
    pictures differ in 10 or more; a crop moves 10-16 bits, like the closest different pictures, and
    there the embeddings decide. Embeddings alone do not: a short run from scratch maps different
    pictures of one class as close as copies (docs/benchmarks.md).
    """
    signs = np.where(hashes, 1.0, -1.0).astype(np.float32)
    bits = hashes.shape[1]
    found: dict[tuple[int, int], Pair] = {}
    same_bytes = defaultdict(list)
    for i, digest in enumerate(digests):
        same_bytes[digest].append(i)
    for start in range(0, len(digests), BLOCK):
        rows = np.arange(start, min(start + BLOCK, len(digests)))
        distance = np.rint((bits - signs[rows] @ signs.T) / 2).astype(np.int64)
        cosine = embedding[rows] @ embedding.T if embedding is not None else None
        close = distance <= hash_distance
        if cosine is not None:
            close |= (distance <= 2 * hash_distance) & (cosine >= similarity)
        for r, b in zip(*np.nonzero(close), strict=True):
            a = int(rows[r])
            if a < b:
                sim = float(cosine[r, b]) if cosine is not None else 1 - distance[r, b] / bits
                found[(a, int(b))] = Pair(a, int(b), "near", sim, int(distance[r, b]), _leak(splits, a, b))
    for group in same_bytes.values():
        for x, a in enumerate(group):
            for b in group[x + 1 :]:
                found[(a, b)] = Pair(a, b, "exact", 1.0, 0, _leak(splits, a, b))
    return sorted(found.values(), key=lambda p: (p.kind != "exact", -p.similarity, p.hash_distance))


def _leak(splits: np.ndarray, a: int, b: int) -> bool:
    return splits[a] != splits[b] and splits[a] in SPLITS and splits[b] in SPLITS
