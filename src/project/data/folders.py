"""The folder layout: one sub-folder per class, split into train/, val/ (and test/) or not split at all.

    root/train/<class>/*.jpg   root/val/<class>/*.jpg   [root/test/<class>/*.jpg]
    root/<class>/*.jpg         (no split: --data.val_split holds out a fraction)

Class names are the train (or root) sub-folder names, sorted; val and test must use the same ones.
"""

from __future__ import annotations

import os
from pathlib import Path

from project.data.index import IMAGE_EXTENSIONS, HoldOut, ImageIndex, Splits, list_images
from project.errors import UserError

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


def class_folders(root: Path) -> list[str]:
    """The visible sub-folders of `root`, sorted: each one is a class."""
    if not root.is_dir():
        raise UserError(
            f"Data folder '{root}' does not exist (or is not a folder).",
            "set --data.root to a folder with one sub-folder of images per class "
            "(or train/ and val/ folders that each have them).",
        )
    names = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not names:
        raise UserError(
            f"Data folder '{root}' has no class sub-folders.",
            "put the images of each class in its own folder, "
            f"e.g. '{root}/cat/001.jpg', '{root}/dog/002.jpg'.",
        )
    return names


def scan_folder(root: Path, class_names: list[str] | None = None) -> ImageIndex:
    """Index `root/<class>/**/<image>`; with `class_names`, the folders must be exactly those classes."""
    found = class_folders(root)
    if class_names is not None and found != list(class_names):
        missing = sorted(set(class_names) - set(found))
        extra = sorted(set(found) - set(class_names))
        raise UserError(
            f"Class folders in '{root}' differ from the training classes: "
            f"missing {missing}, unexpected {extra}.",
            f"give every split the same class sub-folders (the training classes are {list(class_names)}).",
        )
    paths: list[str] = []
    labels: list[int] = []
    indexed = [os.path.realpath(root)] + [os.path.realpath(root / name) for name in found]
    for label, name in enumerate(found):
        files = list_images(root / name, indexed)
        if not files:
            raise UserError(
                f"Class folder '{root / name}' has no images "
                f"(looked for {', '.join(sorted(IMAGE_EXTENSIONS))} in any case).",
                "add images to it or remove the folder.",
            )
        paths.extend(os.path.join(name, f) for f in files)
        labels.extend([label] * len(files))
    return ImageIndex.from_listing(root, paths, labels, tuple(found))
