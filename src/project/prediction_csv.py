"""The predictions CSV of `predict` and of the torch-free `infer`: file, class_name, probability, top-k.

Multi-label models write `file, labels, probability_<label>...` instead: the predicted labels
(separated by spaces) and every label's sigmoid probability.

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


def multilabel_header(names: Sequence[str]) -> list[str]:
    """Column names for a multi-label model with labels `names`."""
    return ["file", "labels", *(f"probability_{name}" for name in names)]


def multilabel_row(
    file: str, names: Sequence[str], probabilities: Sequence[float], threshold: float
) -> list[str]:
    """One image's row: the labels whose probability reaches `threshold`, then every probability."""
    chosen = " ".join(n for n, p in zip(names, probabilities, strict=True) if p >= threshold)
    return [file, chosen, *(f"{p:.6f}" for p in probabilities)]


def row(file: str, names: Sequence[str], probabilities: Sequence[float]) -> list[str]:
    """One image's row; `names` and `probabilities` are its top-k classes, most likely first."""
    cells = [file, names[0], f"{probabilities[0]:.6f}"]
    for name, probability in zip(names, probabilities, strict=True):
        cells += [name, f"{probability:.6f}"]
    return cells
