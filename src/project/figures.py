"""Matplotlib figures of a run: captioned image grids, the confusion matrix, per-class accuracy.

Figures are drawn on matplotlib's Agg canvas without pyplot (no display, no global figure state),
and returned as uint8 RGB arrays [H, W, 3] that TensorBoard and the report both take. numpy and
matplotlib only: the report draws these without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

RIGHT, WRONG = "#1a7f37", "#cf222e"


def to_rgb(figure: Figure) -> np.ndarray:
    """Render a figure to a uint8 RGB array [H, W, 3]."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def image_grid(
    grid: np.ndarray,
    captions: Sequence[str],
    columns: int,
    cell: int,
    padding: int,
    colors: Sequence[str] | None = None,
    title: str = "",
) -> np.ndarray:
    """Caption the cells of a tiled image (torchvision's make_grid layout: square cells of `cell` pixels
    with `padding` pixels before each), one caption in the padding above each cell."""
    height, width = grid.shape[:2]
    # small images (32 px) are shown larger so the captions stay readable; wide grids are shown smaller
    scale = min(max(1.0, 96 / cell), 1600 / width)
    title_inches = 0.3 if title else 0.0
    figure = Figure(figsize=(width * scale / 100, height * scale / 100 + title_inches), dpi=100)
    ax = figure.add_axes((0, 0, 1, 1 - title_inches / figure.get_figheight()))
    ax.imshow(grid, interpolation="nearest")
    ax.set_axis_off()
    step = cell + padding
    for i, caption in enumerate(captions):
        row, column = divmod(i, columns)
        x, y = padding + column * step + cell / 2, padding + row * step - padding * 0.15
        color = colors[i] if colors else "black"
        ax.text(x, y, caption, ha="center", va="bottom", fontsize=7, color=color, clip_on=True)
    if title:
        figure.suptitle(title, fontsize=9, y=0.995, va="top")
    return to_rgb(figure)


def confusion_matrix(counts: np.ndarray, class_names: Sequence[str], title: str = "") -> np.ndarray:
    """The confusion matrix as an image, for TensorBoard."""
    side = min(14.0, 2.5 + 0.45 * len(class_names))
    figure = Figure(figsize=(side + 1.2, side), dpi=100)
    draw_confusion_matrix(figure.add_subplot(), counts, class_names, title)
    figure.tight_layout()
    return to_rgb(figure)


def draw_confusion_matrix(ax: Axes, counts: np.ndarray, class_names: Sequence[str], title: str = "") -> None:
    """Rows normalized to 1 (each true class), cells annotated with the fraction."""
    counts = np.asarray(counts, dtype=np.float64)
    rows = counts.sum(axis=1, keepdims=True)
    fractions = np.divide(counts, rows, out=np.zeros_like(counts), where=rows > 0)
    n = len(class_names)
    image = ax.imshow(fractions, cmap="Blues", vmin=0, vmax=1)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set(xticks=range(n), yticks=range(n), xlabel="predicted", ylabel="true")
    ax.set_xticklabels(class_names, rotation=45, ha="right", fontsize=8)
    ax.set_yticklabels(class_names, fontsize=8)
    if n <= 30:  # beyond that the numbers do not fit in the cells
        for (i, j), value in np.ndenumerate(fractions):
            if value >= 0.005:
                color = "white" if value > 0.5 else "black"
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=color)
    accuracy = np.trace(counts) / max(counts.sum(), 1)
    ax.set_title(f"{title} confusion matrix, rows sum to 1 (accuracy {accuracy:.3f})".strip(), fontsize=9)


def draw_per_class(ax: Axes, accuracy: Sequence[float], class_names: Sequence[str]) -> None:
    """Horizontal bars of per-class accuracy, first class on top; classes well below the mean in red."""
    accuracy = np.asarray(accuracy, dtype=np.float64)
    order = np.arange(len(class_names))[::-1]
    colors = [WRONG if a < accuracy.mean() - 0.1 else RIGHT for a in accuracy[order]]
    ax.barh(range(len(order)), accuracy[order], color=colors)
    ax.set_yticks(range(len(order)), [class_names[i] for i in order], fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("accuracy (recall) per class")
    for y, a in enumerate(accuracy[order]):
        ax.text(min(a, 0.88) + 0.01, y, f"{a:.3f}", va="center", fontsize=7)
