"""The audit's view of the data: fit's data module, plus the layouts that have no validation split.

An audit needs no split: a folder of class folders or `train/` alone are audited whole (their split
is `all`, or `train`).
So is a labels CSV without a split column.  # room: multilabel
Everything else is fit's index as is. Shards are audited from their images, written to a temporary
folder first (multiclass shards).
"""

from __future__ import annotations

import os
import tempfile
from functools import cached_property
from pathlib import Path

import numpy as np

from project.data.datamodule import ImageDataModule
from project.data.index import ImageIndex

# room: multilabel begin
from project.data.source import format_module
from project.errors import UserError
from project.model import is_multilabel

# room: multilabel end

WHOLE = "all"  # the split name of images that belong to no split


class AuditDataModule(ImageDataModule):
    """ImageDataModule (the same options) whose splits may be one unsplit set."""

    @cached_property
    def splits(self) -> dict[str, ImageIndex]:
        if self._streamed is not None:
            self._extract_streamed()
        if self.val_split is not None:
            return ImageDataModule.splits.func(self)  # split as fit would split it
        # a layout that fit would need --data.val_split for is audited as it is
        key = WHOLE if not (self.root / "train").is_dir() else "train"
        key = WHOLE if self.labels_csv is not None else key  # room: multilabel
        splits = self._read_splits(lambda index, problem, instead: {key: index})
        self._check_num_classes(next(iter(splits.values())).class_names)
        return splits

    def _extract_streamed(self) -> None:
        """Streamed data (shards) is audited from its images, written once to a temporary folder that is then
        the root."""
        source = self.source
        # room: multilabel begin
        if is_multilabel(source):
            raise UserError(
                f"audit reads multi-label data from a labels CSV; '{source.where}' holds multi-label "
                f"{format_module(self._streamed).KIND}.",
                f"audit the images and CSV they were made from ({source.made_from or 'their folder'}).",
            )
        # room: multilabel end
        self._extracted = tempfile.TemporaryDirectory(prefix="audit-shards-")  # removed with this object
        folder = Path(self._extracted.name)
        print(f"Writing the images of '{source.where}' to '{folder}' for the audit (removed at its end)...")
        source.extract(folder)
        self.root, self._streamed, self._streamed_root = folder, None, None
        del self.source  # the files' source from now on

    def close(self) -> None:
        """Remove the shards' images copied for the audit, if any."""
        extracted = self.__dict__.pop("_extracted", None)
        if extracted is not None:
            extracted.cleanup()

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
