"""The audit's view of the data: fit's data module, plus the layouts that have no validation split.

An audit needs no split: a folder of class folders, `train/` alone, or a labels CSV without a split
column are audited whole (their split is `all`, or `train`). Everything else is fit's index as is.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import numpy as np

from project.data.datamodule import EMBEDDED_MULTILABEL_CSV, ImageDataModule
from project.data.index import ImageIndex, scan_folder
from project.data.labels_csv import read_labels_csv
from project.data.multishapes import generate_multishapes
from project.data.shapes import generate_shapes

WHOLE = "all"  # the split name of images that belong to no split


class AuditDataModule(ImageDataModule):
    """ImageDataModule (the same options) whose splits may be one unsplit set."""

    @cached_property
    def splits(self) -> dict[str, ImageIndex]:
        if self.embedded:
            generate_shapes(self.root)
        if self.val_split is None:
            whole = self._unsplit()
            if whole is not None:
                self._check_num_classes(next(iter(whole.values())).class_names)
                return whole
        return ImageDataModule.splits.func(self)

    def _unsplit(self) -> dict[str, ImageIndex] | None:
        """The layouts fit would need --data.val_split for, as they are; None for the others."""
        if self.labels_csv is not None:
            if self.labels_csv == EMBEDDED_MULTILABEL_CSV:
                generate_multishapes(EMBEDDED_MULTILABEL_CSV.parent)
            index, split = read_labels_csv(self.labels_csv, self.root, self.label_delimiter)
            return {WHOLE: index} if split is None else None
        if not (self.root / "train").is_dir():
            return {WHOLE: scan_folder(self.root)}
        if not (self.root / "val").is_dir():
            train = scan_folder(self.root / "train")
            test = self.root / "test"
            extra = {"test": scan_folder(test, list(train.class_names))} if test.is_dir() else {}
            return {"train": train, **extra}
        return None

    @property
    def class_names(self) -> list[str]:
        return list(next(iter(self.splits.values())).class_names)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def combined(splits: dict[str, ImageIndex], root: Path) -> tuple[ImageIndex, np.ndarray]:
    """One index of every split's images (paths relative to `root`) and each image's split name."""
    paths, labels, names = [], [], []
    for name, index in splits.items():
        for i in range(len(index)):
            paths.append(os.path.relpath(index.path(i), root))
        labels.append(index.labels)
        names.extend([name] * len(index))
    class_names = next(iter(splits.values())).class_names
    encoded = np.array([os.fsencode(p) for p in paths], dtype=np.bytes_)
    return ImageIndex(root, encoded, np.concatenate(labels), class_names), np.array(names)
