"""Map-style datasets over an ImageIndex (labelled) or a file list (prediction)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset, default_collate

from project.data.decode import BadImageError, load_rgb
from project.data.decoded import DecodedImages
from project.data.index import ImageIndex
from project.data.skipped import SkipLog
from project.data.worker_reads import WorkerReads
from project.terminal import printable

Transform = Callable[[torch.Tensor], torch.Tensor]


class ImageDataset(Dataset):
    """(uint8 image, label) pairs; a bad file raises, or yields None when `skip_bad_images` is set.

    With `cache` (images decoded into memory beforehand), images come from that buffer instead of the
    files (same transforms after).
    `reads` (set by the data module's loader): where each worker notes the file it opens.
    """

    reads: WorkerReads | None = None

    def __init__(
        self,
        index: ImageIndex,
        transform: Transform,
        skip_bad_images: bool = False,
        skip_log: SkipLog | None = None,
        cache: DecodedImages | None = None,
    ) -> None:
        self.index = index
        self.cache = cache
        self.transform = transform
        self.skip_bad_images = skip_bad_images
        self.skip_log = skip_log
        self.skipped = 0

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int | torch.Tensor] | None:
        # from memory: decoded once beforehand, where a bad file was reported
        image = self.cache.image(i) if self.cache is not None else _load(self.index.path(i), self)
        if image is None:
            return None
        label = self.index.labels[i]
        # room: multilabel begin
        if label.ndim:  # a multi-hot uint8 row: multi-label data
            return self.transform(image), torch.from_numpy(label.copy())
        # room: multilabel end
        return self.transform(image), int(label)


class FileDataset(Dataset):
    """(uint8 image, position in `files`) pairs for prediction on unlabelled images."""

    reads: WorkerReads | None = None

    def __init__(
        self,
        files: Sequence[Path],
        transform: Transform,
        skip_bad_images: bool = False,
        root: Path | None = None,
        skip_log: SkipLog | None = None,
    ) -> None:
        self.files = list(files)
        self.root = root  # the files are reported relative to it
        self.transform = transform
        self.skip_bad_images = skip_bad_images
        self.skip_log = skip_log
        self.skipped = 0

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int] | None:
        image = _load(self.files[i], self)
        return None if image is None else (self.transform(image), i)


def _load(path: Path, dataset: ImageDataset | FileDataset) -> torch.Tensor | None:
    if dataset.reads is not None:
        dataset.reads.note(path)
    try:
        return load_rgb(path)
    except BadImageError as e:
        if not dataset.skip_bad_images:
            raise
        dataset.skipped += 1
        if dataset.skip_log is not None:
            dataset.skip_log.add(path, e.reason)
        warnings.warn(
            # the file and the reason, not str(e): its fix is to set the skip_bad_images this run has
            f"Skipped a bad image ({dataset.skipped} in this worker so far): "
            + printable(f"'{path}': {e.reason}."),
            stacklevel=2,
        )
        return None


def collate_skipping_none(batch: list) -> list | None:
    """default_collate over the samples that loaded; None when none of them did."""
    kept = [sample for sample in batch if sample is not None]
    return default_collate(kept) if kept else None
