"""The folder layout: one sub-folder per class, split into train/, val/ (and test/) or not split at all.

    root/train/<class>/*.jpg   root/val/<class>/*.jpg   [root/test/<class>/*.jpg]
    root/<class>/*.jpg         (no split: --data.val_split holds out a fraction)

Class names are the train (or root) sub-folder names, sorted; val and test must use the same ones.
"""

from __future__ import annotations

from pathlib import Path

from project.data.index import HoldOut, Splits, scan_folder

FOLDER_VAL = "a val/ folder with the same class folders"  # what a tree without val/ could add


def folder_splits(root: Path, hold: HoldOut) -> Splits:
    """The labelled splits of a folder tree; a tree without val/ gets one from `hold`."""
    if not (root / "train").is_dir():
        return hold(scan_folder(root), f"'{root}' has no train/ and val/ folders.", FOLDER_VAL)
    train = scan_folder(root / "train")
    names = list(train.class_names)
    if (root / "val").is_dir():
        splits = {"train": train, "val": scan_folder(root / "val", names)}
    else:
        splits = hold(train, f"'{root}' has train/ but no val/ folder.", FOLDER_VAL)
    if (root / "test").is_dir():
        splits["test"] = scan_folder(root / "test", names)
    return splits
