"""The predictions CSV of `predict` and of the torch-free `infer`: file, class_name, probability, top-k.
# room: unknown begin

Then `reason`: class_name is `unknown` for an image below the export's unknown threshold
(`project.deploy.calibration`); probability and the top-k columns still give its most probable
classes, and `reason` says why (its score against the threshold, and the share of validation images
the threshold accepts); `reason` is empty for an image answered with a class.
# room: unknown end
# room: multilabel begin

Multi-label models write `file, labels, probability_<label>...` instead: the predicted labels
(separated by spaces) and every label's sigmoid probability.
# room: multilabel end

Both commands write it through these functions, so their columns cannot drift apart. The file is
UTF-8, except that a file name which is not (a name is bytes on Linux) keeps its own bytes
(Python's "surrogateescape"): every name the file system can hold is written, and reading the CSV
with `errors="surrogateescape"` gives back the exact name.

Names are data, never formulas: each name cell follows the spreadsheet rule of `project.csv_cells`
(`=1+2.png` is written `'=1+2.png`; `csv_cells.original_cell` gives the name back).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from project.csv_cells import spreadsheet_cell

ENCODING = "utf-8"
ERRORS = "surrogateescape"  # os.fsdecode's way back to a name's bytes


def open_csv(path: Path) -> TextIO:
    """`path` opened for writing the CSV with its encoding rule."""
    return open(path, "w", newline="", encoding=ENCODING, errors=ERRORS)


def header(k: int) -> list[str]:
    """Column names for the top `k` classes."""
    columns = ["file", "class_name", "probability"]
    for rank in range(1, k + 1):
        columns += [f"top{rank}_class", f"top{rank}_probability"]
    columns.append("reason")  # room: unknown
    return columns


# room: multilabel begin
def multilabel_header(names: Sequence[str]) -> list[str]:
    """Column names for a multi-label model with labels `names`."""
    return ["file", "labels", *(f"probability_{name}" for name in names)]  # never a formula


def multilabel_row(
    file: str, names: Sequence[str], probabilities: Sequence[float], threshold: float
) -> list[str]:
    """One image's row: the labels whose probability reaches `threshold`, then every probability."""
    chosen = " ".join(n for n, p in zip(names, probabilities, strict=True) if p >= threshold)
    return [spreadsheet_cell(file), spreadsheet_cell(chosen), *(f"{p:.6f}" for p in probabilities)]


# room: multilabel end


def row(
    file: str,
    names: Sequence[str],
    probabilities: Sequence[float],
    # room: unknown begin
    class_name: str | None = None,
    reason: str = "",
    # room: unknown end
) -> list[str]:
    """One image's row; `names` and `probabilities` are its top-k classes, most likely first.

    # room: unknown begin
    `class_name` is the answer when it is not the top class (`unknown`: below the export's threshold),
    and `reason` says why (`Calibration.reason`).
    # room: unknown end
    """
    cells = [spreadsheet_cell(file), spreadsheet_cell(names[0]), f"{probabilities[0]:.6f}"]
    for name, probability in zip(names, probabilities, strict=True):
        cells += [spreadsheet_cell(name), f"{probability:.6f}"]
    # room: unknown begin
    if class_name:  # the answer is not the top class
        cells[1] = spreadsheet_cell(class_name)
    cells.append(reason)
    # room: unknown end
    return cells
