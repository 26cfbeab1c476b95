"""The `knn` unknown score: how close an image comes to the training images, in what the network sees
and in what it was trained to overlook.

An image's descriptor has three blocks (`descriptors`):

- `features`: the network's penultimate features (the input of its classification layer), a second
  output of every export;
- `gradients`: the histogram of its grey-level differences between neighbouring pixels (8 bins from
  flat to sharp): its texture;
- `colours`: the histogram of its pixels over 4 x 4 x 4 RGB cells: its palette.

The network alone is not enough: a model of drawn shapes learnt to ignore colour and texture, so a
photo reaches it as "some blob", inside its training features (the features' score alone answered
37 % of CIFAR-10 photos `unknown`, the three blocks together 92 %: docs/benchmarks.md).

`export` keeps the descriptors of up to MAX_ROWS training images, evenly spaced over the split, each
block scaled to length 1, in `<stem>.features.npy` beside the model: a plain float16 array, read with
`np.load(allow_pickle=False)`, so reading it runs nothing. Per block, an image's similarity is the
cosine similarity of its block to the K-th nearest training row (Sun et al., "Out-of-distribution
detection with deep nearest neighbors", ICML 2022); standardized by the mean and spread of that
similarity on the validation images (`standardize`, in the sidecar), the three are summed into the
score: high for an image like the training images on every account, low for one far from them on any.

Like the sidecar, the file may come from another machine: `FeatureBank.load` checks its size, type,
shape, values and sha256 (recorded in the sidecar) before any row is used. Numpy only.
"""

from __future__ import annotations

import hashlib
import io
import math
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from project.errors import UserError

SUFFIX = "features.npy"  # the bank's file: <stem>.features.npy beside <stem>.onnx and <stem>.json
K = 5  # the neighbour whose similarity counts: the 5th (bench/unknown.py)
MAX_ROWS = 4096  # training images kept: 4.6 MiB of float16 at 512 network features (resnet18)
MAX_BYTES = 32 << 20  # the file's bound (a wider network keeps fewer rows): 32 MiB
DTYPE = np.dtype("<f2")  # half precision: similarities move by ~1e-3, far below any threshold's margin
NORM_TOLERANCE = 1e-2  # float16 blocks of length 1 are within 1e-3 of it
# the least spread a block is standardized by: where every validation image scores alike (float16 rounding
# apart), one image's rounding must not move the score by thousands
MIN_SPREAD = 1e-3
# |difference| of neighbouring grey levels: bins [0, 2), [2, 4), ..., [128, 256)
GRADIENT_EDGES = np.array([2, 4, 8, 16, 32, 64, 128])
COLOUR_LEVELS = 4  # per channel: 4 x 4 x 4 cells
IMAGE_BLOCKS = (("gradients", len(GRADIENT_EDGES) + 1), ("colours", COLOUR_LEVELS**3))
FIX = "export the checkpoint again with `python -m project export`, and keep the export's files together."


def image_statistics(images: np.ndarray) -> np.ndarray:
    """[N, 8 + 64]: each uint8 image's [N, 3, H, W] gradient and colour histograms (square roots of the
    shares, so that each block has length 1 and a cosine similarity is the Bhattacharyya coefficient)."""
    images = np.asarray(images)
    n = len(images)
    grey = images.astype(np.float32).mean(axis=1)
    steps = np.concatenate(
        [np.abs(np.diff(grey, axis=2)).reshape(n, -1), np.abs(np.diff(grey, axis=1)).reshape(n, -1)], axis=1
    )
    gradients = _counts(np.searchsorted(GRADIENT_EDGES, steps, side="right"), len(GRADIENT_EDGES) + 1)
    cells = (images.astype(np.int32) * COLOUR_LEVELS) // 256
    colour = (cells[:, 0] * COLOUR_LEVELS + cells[:, 1]) * COLOUR_LEVELS + cells[:, 2]
    colours = _counts(colour.reshape(n, -1), COLOUR_LEVELS**3)
    return np.concatenate([np.sqrt(gradients), np.sqrt(colours)], axis=1).astype(np.float32)


def _counts(bins: np.ndarray, width: int) -> np.ndarray:
    """The share of each of `width` bins in each row of `bins` [N, M]."""
    offsets = bins + np.arange(len(bins))[:, None] * width
    counts = np.bincount(offsets.ravel(), minlength=len(bins) * width).reshape(len(bins), width)
    return counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)


def descriptors(features: np.ndarray, images: np.ndarray) -> np.ndarray:
    """[N, D + 72]: the network's features [N, D] beside the image statistics of the uint8 `images`."""
    return np.concatenate([np.asarray(features, dtype=np.float32), image_statistics(images)], axis=1)


def blocks_for(dim: int) -> tuple[tuple[str, int], ...]:
    """The blocks of a descriptor of `dim` columns: the network's features first, then the image's."""
    return (("features", dim - sum(width for _, width in IMAGE_BLOCKS)), *IMAGE_BLOCKS)


def rows_for(dim: int, available: int) -> int:
    """How many training images a bank of `dim`-column descriptors keeps: MAX_ROWS, fewer when they would
    pass MAX_BYTES, never more than there are."""
    return max(0, min(available, MAX_ROWS, MAX_BYTES // (DTYPE.itemsize * dim)))


def normalized(features: np.ndarray, blocks: tuple[tuple[str, int], ...]) -> np.ndarray:
    """`features` [N, D] with each block scaled to length 1 (float32; a zero block stays zero)."""
    features = np.asarray(features, dtype=np.float32)
    parts, start = [], 0
    for _, width in blocks:
        part = features[:, start : start + width]
        parts.append(part / np.maximum(np.linalg.norm(part, axis=1, keepdims=True), 1e-12))
        start += width
    return np.concatenate(parts, axis=1)


@dataclass(frozen=True)
class FeatureBank:
    """Training images' descriptors, each block of length 1: rows [n, D + 72] float32 (from the float16
    file); `standardize`: each block's similarity mean and spread on validation (empty until fitted)."""

    rows: np.ndarray
    standardize: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return int(self.rows.shape[1])

    @property
    def blocks(self) -> tuple[tuple[str, int], ...]:
        return blocks_for(self.dim)

    def similarities(self, descriptors: np.ndarray) -> dict[str, np.ndarray]:
        """Per block, each image's cosine similarity [N] to its K-th nearest training row."""
        queries = normalized(descriptors, self.blocks)
        k = min(K, len(self.rows))
        out, start = {}, 0
        for name, width in self.blocks:
            similarity = queries[:, start : start + width] @ self.rows[:, start : start + width].T
            out[name] = -np.partition(-similarity, k - 1, axis=1)[:, k - 1].astype(np.float64)
            start += width
        return out

    def scores(self, descriptors: np.ndarray) -> np.ndarray:
        """The `knn` score [N]: the blocks' similarities, standardized, summed."""
        return sum(
            (similarity - self.standardize[name][0]) / self.standardize[name][1]
            for name, similarity in self.similarities(descriptors).items()
        )

    def standardized(self, descriptors: np.ndarray) -> FeatureBank:
        """This bank with `standardize` fitted on the validation images' `descriptors`."""
        fitted = {
            name: (float(s.mean()), max(float(s.std()), MIN_SPREAD))
            for name, s in self.similarities(descriptors).items()
        }
        return FeatureBank(self.rows, fitted)

    def to_bytes(self) -> bytes:
        """The .npy file's bytes (float16)."""
        buffer = io.BytesIO()
        np.save(buffer, self.rows.astype(DTYPE), allow_pickle=False)
        return buffer.getvalue()

    @classmethod
    def of(cls, descriptors: np.ndarray) -> FeatureBank:
        """A bank of `descriptors` [n, D + 72], normalized, stored as float16 and read back as the file is."""
        blocks = blocks_for(np.asarray(descriptors).shape[1])
        return cls(normalized(descriptors, blocks).astype(DTYPE).astype(np.float32))

    @classmethod
    def load(cls, path: Path, described: Mapping, sidecar: Path | str) -> FeatureBank:
        """The bank at `path`, as the sidecar's `feature_bank` (`described`, checked there) describes it;
        UserError naming the file and what is wrong with it otherwise."""

        def refuse(problem: str) -> UserError:
            return UserError(f"Feature bank '{path}' (named by sidecar '{sidecar}') {problem}.", FIX)

        try:
            mode = path.stat().st_mode
        except OSError:
            raise refuse("does not exist") from None
        if not stat.S_ISREG(mode):
            raise refuse("is not a regular file")
        if path.stat().st_size > MAX_BYTES + 4096:
            raise refuse(f"is {path.stat().st_size} bytes, more than a bank's {MAX_BYTES} + header")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != described["sha256"]:
            raise refuse("does not have the sha256 the sidecar records (another export's file, or changed)")
        try:
            rows = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:  # an object array, or not an .npy file
            raise refuse(f"is not a plain .npy array ({' '.join(str(e).split())[:120]})") from None
        shape = (described["rows"], described["dim"])
        if rows.dtype != DTYPE or rows.shape != shape:
            raise refuse(f"holds {rows.dtype} {rows.shape}; expected float16 {shape}")
        rows = rows.astype(np.float32)
        lengths = [np.linalg.norm(block, axis=1) for block in np.split(rows, _cuts(shape[1]), axis=1)]
        if (
            not np.isfinite(rows).all()
            or max(np.abs(length - 1).max() for length in lengths) > NORM_TOLERANCE
        ):
            raise refuse("holds rows whose blocks are not finite vectors of length 1")
        standardize = {name: (float(m), float(s)) for name, (m, s) in described["standardize"].items()}
        return cls(rows, standardize)


def _cuts(dim: int) -> list[int]:
    """Where the blocks of a `dim`-column descriptor start, past the first."""
    starts, total = [], 0
    for _, width in blocks_for(dim)[:-1]:
        total += width
        starts.append(total)
    return starts


def describe(bank: FeatureBank, file: str, data: bytes) -> dict:
    """The sidecar's `feature_bank`: the file beside it, its shape, size, sha256, blocks, K and the
    standardization fitted on validation."""
    return {
        "file": file,
        "rows": len(bank.rows),
        "dim": bank.dim,
        "dtype": "float16",
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "k": K,
        "blocks": [[name, width] for name, width in bank.blocks],
        "standardize": {name: [mean, spread] for name, (mean, spread) in bank.standardize.items()},
        "meaning": "per training image (evenly spaced): the network's penultimate features, the gradient "
        "and the colour histogram, each block of length 1; an image's knn score sums, over the blocks, "
        f"its cosine similarity to the {K}th nearest row, standardized by `standardize` (mean, spread "
        "on the validation images)",
    }


def valid_standardize(value: object, blocks: tuple[tuple[str, int], ...]) -> bool:
    """Whether `value` gives every block a finite mean and a finite spread > 0, as `describe` writes it."""
    if not isinstance(value, dict) or set(value) != {name for name, _ in blocks}:
        return False
    for pair in value.values():
        if not (isinstance(pair, list) and len(pair) == 2):
            return False
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in pair
        ):
            return False
        if pair[1] <= 0:
            return False
    return True
