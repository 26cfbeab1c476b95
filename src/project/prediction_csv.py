"""The predictions CSV of `predict` and of the torch-free `infer`: file, class_name, probability, top-k.

Both commands write it through these two functions, so their columns cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence


def header(k: int) -> list[str]:
    """Column names for the top `k` classes."""
    columns = ["file", "class_name", "probability"]
    for rank in range(1, k + 1):
        columns += [f"top{rank}_class", f"top{rank}_probability"]
    return columns


def row(file: str, names: Sequence[str], probabilities: Sequence[float]) -> list[str]:
    """One image's row; `names` and `probabilities` are its top-k classes, most likely first."""
    cells = [file, names[0], f"{probabilities[0]:.6f}"]
    for name, probability in zip(names, probabilities, strict=True):
        cells += [name, f"{probability:.6f}"]
    return cells
