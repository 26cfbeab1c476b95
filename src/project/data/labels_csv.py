"""The multi-label index: a CSV of `file,labels[,split]` read into paths and a multi-hot uint8 matrix.

    file,labels,split
    images/0001.jpg,cat dog,train
    images/0002.jpg,dog,val
    images/0003.jpg,,train        <- no label at all is allowed (a negative image)

Labels are separated by `delimiter` (default: whitespace); the label names are all the labels that
occur, sorted. `split` (train, val or test) is optional: without it, --data.val_split holds out a
seeded random fraction.

Cells follow the spreadsheet rule of every CSV here (`project.csv_cells`): a `'` that guards
a formula character (`'=1+2.png`) is dropped, so a list built from `audit`'s or `predict`'s CSVs
names the same files and labels.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from project.csv_cells import original_cell
from project.data.index import HoldOut, ImageIndex, Splits
from project.errors import UserError

SPLITS = ("train", "val", "test")


def split_labels(cell: str, delimiter: str) -> list[str]:
    """The labels of one CSV cell; blank entries are dropped."""
    parts = cell.split() if not delimiter.strip() else cell.split(delimiter)
    return [p.strip() for p in parts if p.strip()]


def read_labels_csv(path: Path, base: Path, delimiter: str = " ") -> tuple[ImageIndex, np.ndarray | None]:
    """Index the CSV's rows (files relative to `base`); also return its split column, if it has one."""
    if not path.is_file():
        raise UserError(
            f"Labels file '{path}' (--data.labels_csv) does not exist.",
            "pass a CSV with a header row `file,labels` (optionally `split`), one image per row.",
        )
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        if not {"file", "labels"} <= set(columns):
            raise UserError(
                f"Labels file '{path}' has the columns {columns}; expected `file` and `labels`.",
                "start the CSV with the header row `file,labels` (or `file,labels,split`).",
            )
        rows = [
            (original_cell(r["file"] or ""), original_cell(r["labels"] or ""), (r.get("split") or "").strip())
            for r in reader
        ]
    if not rows:
        raise UserError(f"Labels file '{path}' has no rows.", "add one row per image: file,labels.")
    files = [file for file, _, _ in rows]
    label_sets = [split_labels(labels, delimiter) for _, labels, _ in rows]
    names = sorted({label for labels in label_sets for label in labels})
    if not names:
        raise UserError(
            f"Labels file '{path}' names no labels.",
            f"list each image's labels in the `labels` column, separated by {delimiter!r}.",
        )
    missing = [(n, file) for n, file in enumerate(files, 2) if not (base / file).is_file()]
    if missing:
        line, file = missing[0]
        raise UserError(
            f"{len(missing)} file(s) in '{path}' do not exist, e.g. '{base / file}' (line {line}).",
            f"write paths relative to '{base}' (the CSV's folder, or --data.root when set).",
        )
    position = {name: i for i, name in enumerate(names)}
    multi_hot = np.zeros((len(files), len(names)), dtype=np.uint8)
    for i, labels in enumerate(label_sets):
        multi_hot[i, [position[label] for label in labels]] = 1
    paths = np.array([os.fsencode(f) for f in files], dtype=np.bytes_)
    index = ImageIndex(base, paths, multi_hot, tuple(names))
    if "split" not in columns:
        return index, None
    splits = np.array([split for _, _, split in rows])
    unknown = sorted(set(splits.tolist()) - set(SPLITS))
    if unknown:
        line = int(np.flatnonzero(~np.isin(splits, SPLITS))[0]) + 2
        raise UserError(
            f"Labels file '{path}' has split {unknown[0]!r} on line {line}; expected train, val or test.",
            "set every row's split to train, val or test (or drop the column and use --data.val_split).",
        )
    return index, splits


def csv_splits(path: Path, base: Path, delimiter: str, hold: HoldOut) -> Splits:
    """The labelled splits of a labels CSV: by its split column, or from `hold` when it has none."""
    index, split = read_labels_csv(path, base, delimiter)
    if split is None:
        return hold(index, f"'{path}' has no split column.", "a split column (train/val)")
    splits = {name: index.subset(np.flatnonzero(split == name)) for name in SPLITS}
    if not len(splits["train"]) or not len(splits["val"]):
        raise UserError(
            f"'{path}' needs rows with split train and with split val.",
            "mark some rows val (or drop the split column and use --data.val_split=0.1).",
        )
    return {name: part for name, part in splits.items() if len(part)}
