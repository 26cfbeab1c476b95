"""The dataset index: image paths and labels as flat numpy arrays, and the listing of image files."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from project.errors import UserError
from project.terminal import printable

IMAGE_EXTENSIONS = frozenset(
    {
        ".jpg",
        ".jpeg",
        ".jpe",
        ".png",
        ".bmp",
        ".gif",
        ".tif",
        ".tiff",
        ".webp",
        ".ppm",
        ".pgm",
        ".pbm",
        ".pnm",
    }
)


@dataclass(frozen=True)
class ImageIndex:
    """Relative file paths (fixed-width bytes) and labels; no per-sample Python objects.

    `labels` is an int64 class per image.
    For multi-label data, a uint8 multi-hot matrix [N, classes].  # room: multilabel
    """

    root: Path
    paths: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    @classmethod
    def from_listing(
        cls, root: Path, paths: list[str], labels: list[int], class_names: tuple[str, ...]
    ) -> ImageIndex:
        """Pack a listing into fixed-width byte strings and int64 labels (no per-sample objects remain)."""
        encoded = np.array([os.fsencode(p) for p in paths], dtype=np.bytes_)
        return cls(root, encoded, np.array(labels, dtype=np.int64), class_names)

    def path(self, i: int) -> Path:
        return self.root / os.fsdecode(self.paths[i])

    def subset(self, indices: np.ndarray) -> ImageIndex:
        return ImageIndex(self.root, self.paths[indices], self.labels[indices], self.class_names)

    def class_counts(self) -> dict[str, int]:
        # room: multilabel begin
        if self.labels.ndim == 2:  # multi-label: images that carry each label
            return dict(zip(self.class_names, self.labels.sum(axis=0, dtype=np.int64).tolist(), strict=True))
        # room: multilabel end
        counts = np.bincount(self.labels, minlength=len(self.class_names))
        return dict(zip(self.class_names, counts.tolist(), strict=True))


def is_image_file(name: str) -> bool:
    """True for a visible file with a known image extension, in any case."""
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _overlaps(path: str, trees: list[str]) -> bool:
    """True when real path `path` is inside, equal to, or around one of `trees`."""
    return any(os.path.commonpath([path, tree]) in (path, tree) for tree in trees)


def list_images(folder: Path, indexed: list[str] | None = None) -> list[str]:
    """Image files under `folder` (recursively), relative to it, sorted; hidden folders are skipped.

    A linked folder is followed only into a tree not indexed yet: a link into (or around) `indexed`, the
    real paths already walked, would repeat images or loop forever, so it is skipped with a warning.
    """
    indexed = [os.path.realpath(folder)] if indexed is None else indexed
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and _follow(dirpath, d, indexed))
        rel = os.path.relpath(dirpath, folder)
        found.extend(os.path.normpath(os.path.join(rel, f)) for f in filenames if is_image_file(f))
    return sorted(found)


def _follow(dirpath: str, name: str, indexed: list[str]) -> bool:
    """Whether to walk into sub-folder `name`: plain folders yes, links only into trees not indexed yet."""
    link = os.path.join(dirpath, name)
    if not os.path.islink(link):
        return True
    target = os.path.realpath(link)
    if _overlaps(target, indexed):
        warnings.warn(
            f"Skipped the folder link '{printable(link)}' -> '{printable(target)}': its images are already "
            "indexed (a link into or around the data folder repeats them or loops).",
            stacklevel=4,
        )
        return False
    indexed.append(target)
    return True


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split indices into (train, val) with `fraction` of every class in val; the same for the same seed."""
    if not 0.0 < fraction < 1.0:
        raise UserError(f"--data.val_split={fraction} is outside (0, 1).", "use a fraction such as 0.1.")
    rng = np.random.default_rng(seed)
    train, val = [], []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        members = members[rng.permutation(len(members))]
        n_val = min(len(members) - 1, max(1, round(len(members) * fraction))) if len(members) > 1 else 0
        val.append(members[:n_val])
        train.append(members[n_val:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


# The one interface of a data format (project.data.folders, for one): labelled splits by name, "train"
# and "val" and, when the data has one, "test".
# room: multilabel begin
# project.data.labels_csv is another.
# room: multilabel end
Splits = dict[str, ImageIndex]
# How a format without a val split gets one: hold(index, problem, instead) -> Splits (see hold_out).
HoldOut = Callable[[ImageIndex, str, str], Splits]


def hold_out(index: ImageIndex, problem: str, instead: str, *, fraction: float | None, seed: int) -> Splits:
    """Hold out a seeded, stratified `fraction` of `index` as val (--data.val_split); without a fraction, the
    data has no val split: a UserError saying `problem` and offering `instead` or --data.val_split."""
    if fraction is None:
        raise UserError(
            problem, f"add {instead}, or hold out a seeded, stratified fraction with --data.val_split=0.1."
        )
    strata = index.labels
    # room: multilabel begin
    if strata.ndim == 2:  # multi-label rows have no one class to stratify by: one stratum, a random split
        strata = np.zeros(len(index), dtype=np.int64)
    # room: multilabel end
    train, val = stratified_split(strata, fraction, seed)
    return {"train": index.subset(train), "val": index.subset(val)}
