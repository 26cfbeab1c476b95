"""The predictions CSV of `predict` and of the torch-free `infer`: file, class_name, probability, top-k.

class_name is `unknown` for an image below the export's unknown threshold (`project.deploy.calibration`);
probability and the top-k columns still give its most probable classes.

Multi-label models write `file, labels, probability_<label>...` instead: the predicted labels
(separated by spaces) and every label's sigmoid probability.

Both commands write it through these functions, so their columns cannot drift apart. The file is
UTF-8, except that a file name which is not (a name is bytes on Linux) keeps its own bytes
(Python's "surrogateescape"): every name the file system can hold is written, and reading the CSV
with `errors="surrogateescape"` gives back the exact name.

Names are data, never formulas: a cell that a spreadsheet would evaluate (it starts with = + - @, a
tab or a carriage return, as OWASP's "CSV injection" page lists) is written with a leading `'`
(`spreadsheet_cell`). So that every name stays exact, a cell of `'`s before such a character gets one
more `'` too; a reader removes one leading `'` where `'`s precede such a character (`original_cell`).
The audit's CSVs follow the same rule, and the labels CSV of `--data.labels_csv` is read with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

ENCODING = "utf-8"
ERRORS = "surrogateescape"  # os.fsdecode's way back to a name's bytes

# a spreadsheet evaluates a cell that starts with one of these (after any `'`s of ours: see below)
_FORMULA = re.compile(r"'*[=+\-@\t\r]")


def spreadsheet_cell(text: str) -> str:
    """`text` as a CSV cell that no spreadsheet evaluates: `'` first where it would start a formula.

    Cells that already start with `'`s before such a character get one more, so `original_cell`
    gives back every text exactly (`=1+2.png` -> `'=1+2.png`, `'=x` -> `''=x`, `'a` stays).
    """
    return f"'{text}" if _FORMULA.match(text) else text


def original_cell(cell: str) -> str:
    """The text that `spreadsheet_cell` wrote as `cell`."""
    return cell[1:] if cell.startswith("'") and _FORMULA.match(cell) else cell


def open_csv(path: Path) -> TextIO:
    """`path` opened for writing the CSV with its encoding rule."""
    return open(path, "w", newline="", encoding=ENCODING, errors=ERRORS)


def header(k: int) -> list[str]:
    """Column names for the top `k` classes."""
    columns = ["file", "class_name", "probability"]
    for rank in range(1, k + 1):
        columns += [f"top{rank}_class", f"top{rank}_probability"]
    return columns


def multilabel_header(names: Sequence[str]) -> list[str]:
    """Column names for a multi-label model with labels `names`."""
    return ["file", "labels", *(f"probability_{name}" for name in names)]  # never a formula


def multilabel_row(
    file: str, names: Sequence[str], probabilities: Sequence[float], threshold: float
) -> list[str]:
    """One image's row: the labels whose probability reaches `threshold`, then every probability."""
    chosen = " ".join(n for n, p in zip(names, probabilities, strict=True) if p >= threshold)
    return [spreadsheet_cell(file), spreadsheet_cell(chosen), *(f"{p:.6f}" for p in probabilities)]


def row(
    file: str, names: Sequence[str], probabilities: Sequence[float], class_name: str | None = None
) -> list[str]:
    """One image's row; `names` and `probabilities` are its top-k classes, most likely first.

    `class_name` is the answer when it is not the top class (`unknown`: below the export's threshold).
    """
    cells = [spreadsheet_cell(file), spreadsheet_cell(class_name or names[0]), f"{probabilities[0]:.6f}"]
    for name, probability in zip(names, probabilities, strict=True):
        cells += [spreadsheet_cell(name), f"{probability:.6f}"]
    return cells
