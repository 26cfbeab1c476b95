"""A data source: what the data module, the data check and the export ask of a data format.

Image folders are a FileSource over their splits (data/index.py's `Splits`), the default.
# room: multilabel begin
So is a labels CSV.
# room: multilabel end
A format whose data is streamed is a row of STREAMED (LitData shards, for one), and its source a
StreamedSource. Code outside the data module asks `datamodule.source` and never which format
it is:

    source.where                  the folder, CSV or URL, for messages
    source.task                   multiclass or multilabel  # room: multilabel
    source.class_names            the classes, in label order
    source.split_names            train, val and, when the data has one, test
    source.class_counts(split)    samples per class
                                  (multi-label: samples that carry each label)  # room: multilabel
    source.count(split)           samples in the split
    source.labels(split)          every label of the split (numpy), or None where labels are checked as
                                  each sample is read (shards: reading them all would read the data)
    source.samples(split, n, transform, skip_bad_images)
                                  up to n samples, evenly spaced, as a map-style data set of
                                  (transformed image, label), None for a skipped bad image
    source.image_sizes(split, n)  (width, height) of up to n samples, from their headers

Training and evaluation data sets and loaders are the data module's for files and a streamed
source's own (`dataset`, `loader`).
The data module also decodes files into memory, and augments them a batch at a time. # room: cache
# room: recipes begin
The balanced sampler is the data module's, for files only.
# room: recipes end
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from project.data.dataset import ImageDataset

# room: cache begin
from project.data.decoded import DecodedImages

# room: cache end
from project.data.index import Splits

# The formats whose data is streamed rather than read as image files, each a module asked in turn whether
# --data.root is its own. A format module gives:
#   KIND: what its data is called in messages ("shards")
#   holds(root) -> bool: whether root (a folder or a URL) is in this format, without its packages
#   check_options(...): a UserError for a data option its streaming cannot honour, given by keyword
#     cache: --data.cache  # room: cache
#     balance: --data.balance  # room: recipes
#   source(root) -> StreamedSource (its packages imported then, or one line saying which extra)
STREAMED = (
    # room: shards begin
    "project.data.shards",
    # room: shards end
)


def streamed_format(root: str | Path) -> str | None:
    """The STREAMED format whose data `root` holds (its module's name: a data module that keeps it is
    pickled for DDP's processes), or None for image files."""
    return next((name for name in STREAMED if format_module(name).holds(root)), None)


def format_module(name: str) -> ModuleType:
    """The module of STREAMED format `name`."""
    return importlib.import_module(name)


def data_at_hand(datamodule: object) -> DataSource:
    """`datamodule.source` when its data can be read here; ValueError saying why not (an export from a
    checkpoint whose images stayed on the training machine)."""
    source_here = getattr(datamodule, "source_here", None)
    if source_here is None:
        raise ValueError("no data module was given (pass --data.root, or export from `fit`)")
    return source_here()


def evenly_spaced(length: int, count: int) -> list[int]:
    """Up to `count` positions spread evenly over 0..length-1 (all of them when there are fewer)."""
    if length == 0 or count <= 0:
        return []
    return sorted({int(i) for i in np.linspace(0, length - 1, min(count, length))})


class DataSource(Protocol):
    """The questions every data format answers (see the module's docstring)."""

    where: str
    task: str  # room: multilabel
    class_names: tuple[str, ...]
    split_names: tuple[str, ...]

    def class_counts(self, split: str) -> dict[str, int]: ...

    def count(self, split: str) -> int: ...

    def labels(self, split: str) -> np.ndarray | None: ...

    def samples(self, split: str, count: int, transform: Callable, skip_bad_images: bool) -> Dataset: ...

    def image_sizes(self, split: str, count: int) -> list[tuple[int, int]]: ...


class StreamedSource(DataSource, Protocol):
    """A streamed format's data: the DataSource questions, and its own data sets and loaders."""

    made_from: str | None  # what the data was made from (a folder or CSV), for messages that point there

    def dataset(
        self, split: str, transform: Callable, shuffle: bool, seed: int, skip_bad_images: bool
    ) -> IterableDataset: ...

    def loader(
        self, dataset: IterableDataset, batch_size: int, train: bool, **options: Any
    ) -> DataLoader: ...

    def extract(self, folder: Path) -> None: ...  # its images as class folders under `folder` (the audit)


class FileSource:
    """Image files on disk, split by a data format (class folders or a labels CSV).

    Args:
        splits: The format's labelled splits.
        where: The folder or CSV, for messages.
        # room: cache begin
        decoded: The data module's decoded images by split (--data.cache), read instead of the files.
        # room: cache end
    """

    def __init__(
        self,
        splits: Splits,
        where: str,
        decoded: dict[str, DecodedImages] | None = None,  # room: cache
    ) -> None:
        self.splits = splits
        self.where = where
        self.class_names = tuple(splits["train"].class_names)
        self.split_names = tuple(splits)
        self.decoded = decoded if decoded is not None else {}  # room: cache

    # room: multilabel begin
    @property
    def task(self) -> str:
        """multilabel for multi-hot labels (a labels CSV's), else multiclass."""
        return "multilabel" if self.splits["train"].labels.ndim == 2 else "multiclass"

    # room: multilabel end
    def class_counts(self, split: str) -> dict[str, int]:
        return self.splits[split].class_counts()

    def count(self, split: str) -> int:
        return len(self.splits[split])

    def labels(self, split: str) -> np.ndarray:
        return self.splits[split].labels

    def samples(self, split: str, count: int, transform: Callable, skip_bad_images: bool) -> Dataset:
        index = self.splits[split]
        data = ImageDataset(
            index,
            transform,
            skip_bad_images,
            cache=self.decoded.get(split),  # room: cache
        )
        return Subset(data, evenly_spaced(len(index), count))

    def image_sizes(self, split: str, count: int) -> list[tuple[int, int]]:
        index = self.splits[split]
        sizes = []
        for i in evenly_spaced(len(index), count):
            try:
                with Image.open(index.path(i)) as image:  # reads the header only
                    sizes.append(image.size)
            except OSError:
                continue  # unreadable files are reported by the loader, with their names
        return sizes
