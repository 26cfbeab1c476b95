"""Matplotlib figures of a run: captioned image grids, the confusion matrix, per-class accuracy.

Figures are drawn on matplotlib's Agg canvas without pyplot (no display, no global figure state),
and returned as uint8 RGB arrays [H, W, 3] that TensorBoard and the report both take. numpy and
matplotlib only: the report draws these without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from project.terminal import printable, printable_lines

RIGHT, WRONG = "#1a7f37", "#cf222e"
# Past this many classes a picture shows a summary (the classes of the top confusions, the lowest and
# highest accuracies): a 10,000-class matrix drawn in full needed 9.6 GB and shows nothing readable.
MAX_DRAWN = 50
# Classes up to which the whole confusion matrix is logged each epoch (320 kB of counts); `report` reads
# no larger one back.
MAX_LOGGED_COUNTS = 200

# Names (classes, files, runs, metric tags) are data, drawn as they are: by default matplotlib parses
# `$...$` in any text as mathtext (a class folder `$\undefinedcmd$` was a fatal error at the first
# batch) or hands it to LaTeX. Text artists read these settings when they are made, and tick labels are
# also made while drawing, so every picture is made and drawn inside `plain_text()`.
plain_text = partial(rc_context, {"text.parse_math": False, "text.usetex": False})


def plain_ticks(figure: Figure) -> Figure:
    """`figure` with its log-scaled axes labelled 1e-06, 1e-05, ... (with matplotlib's minus sign; minor
    ticks too, on an axis of less than a decade): matplotlib's own log labels are mathtext
    (`$\\mathdefault{10^{-6}}$`), which `plain_text()` would print as that source."""
    from matplotlib.ticker import LogFormatter

    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            if axis.get_scale() == "log":
                axis.set_major_formatter(LogFormatter())
                axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
    return figure


def to_rgb(figure: Figure) -> np.ndarray:
    """Render a figure to a uint8 RGB array [H, W, 3]."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


MAX_GRID_WIDTH = 800  # pixels


@plain_text()
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
    # small images (32 px) are shown larger so the captions stay readable; a grid is at most 800 px wide,
    # which TensorBoard's image card shows without shrinking it (and its 10-point captions) at default zoom
    scale = min(max(1.0, 96 / cell), MAX_GRID_WIDTH / width)
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
        ax.text(
            x, y, printable_lines(caption), ha="center", va="bottom", fontsize=10, color=color, clip_on=True
        )
    if title:
        figure.suptitle(title, fontsize=11, y=0.995, va="top")
    return to_rgb(figure)


@plain_text()
def confusion_matrix(counts: np.ndarray, class_names: Sequence[str], title: str = "") -> np.ndarray:
    """The confusion matrix as an image, for TensorBoard (a summary past MAX_DRAWN classes)."""
    side = min(14.0, 2.5 + 0.45 * min(len(class_names), MAX_DRAWN))
    figure = Figure(figsize=(side + 1.2, side), dpi=100)
    draw_confusion_matrix(figure.add_subplot(), counts, class_names, title)
    figure.tight_layout()
    return to_rgb(figure)


def top_confusions(counts: np.ndarray, k: int, block: int = 256) -> list[tuple[int, int, int]]:
    """The `k` largest off-diagonal cells as (true, predicted, count), largest first, zeros left out.

    Reads `block` rows at a time, so the memory needed beyond `counts` is block x classes, not classes².
    """
    best: list[tuple[int, int, int]] = []
    for start in range(0, len(counts), block):
        rows = np.array(counts[start : start + block], dtype=np.int64)  # a copy: the diagonal is cleared
        rows[np.arange(len(rows)), np.arange(start, start + len(rows))] = 0
        flat = rows.ravel()
        top = np.argpartition(flat, -k)[-k:] if flat.size > k else np.arange(flat.size)
        best += [(start + i // rows.shape[1], i % rows.shape[1], int(flat[i])) for i in top if flat[i] > 0]
        best = sorted(best, key=lambda cell: (-cell[2], cell[0], cell[1]))[:k]
    return best


def confused_classes(counts: np.ndarray, limit: int = MAX_DRAWN) -> list[int]:
    """Up to `limit` classes, in label order, taken pair by pair from the top confusions."""
    chosen: set[int] = set()
    for true, predicted, _ in top_confusions(counts, limit):
        if len(chosen | {true, predicted}) > limit:
            break
        chosen |= {true, predicted}
    return sorted(chosen) or list(range(min(limit, len(counts))))  # nothing confused: any will do


@plain_text()
def draw_confusion_matrix(ax: Axes, counts: np.ndarray, class_names: Sequence[str], title: str = "") -> None:
    """Rows normalized to 1 (each true class), cells annotated with the fraction.

    Past MAX_DRAWN classes only the classes of the top confusions are drawn (their rows still divided
    by the row's full count), so the picture and its memory stay the same size for any class count.
    """
    counts = np.asarray(counts)  # no copy, also of a CPU torch tensor
    total = len(class_names)
    shown = list(range(total)) if total <= MAX_DRAWN else confused_classes(counts)
    sub = counts[np.ix_(shown, shown)].astype(np.float64)
    rows = counts[shown].sum(axis=1, keepdims=True, dtype=np.float64)
    fractions = np.divide(sub, rows, out=np.zeros_like(sub), where=rows > 0)
    names = [printable(class_names[i]) for i in shown]  # no control characters (no glyph, nor in warnings)
    n = len(names)
    image = ax.imshow(fractions, cmap="Blues", vmin=0, vmax=1)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set(xticks=range(n), yticks=range(n), xlabel="predicted", ylabel="true")
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
    ax.set_yticklabels(names, fontsize=8)
    if n <= 30:  # beyond that the numbers do not fit in the cells
        for (i, j), value in np.ndenumerate(fractions):
            if value >= 0.005:
                color = "white" if value > 0.5 else "black"
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=color)
    accuracy = np.trace(counts) / max(counts.sum(), 1)
    what = (
        "confusion matrix" if n == total else f"confusion matrix of the {n} most confused of {total} classes"
    )
    ax.set_title(f"{title} {what}, rows sum to 1 (accuracy {accuracy:.3f})".strip(), fontsize=9)


@plain_text()
def draw_per_class(ax: Axes, accuracy: Sequence[float], class_names: Sequence[str]) -> None:
    """Horizontal bars of per-class accuracy, first class on top; classes well below the mean in red.

    Past MAX_DRAWN classes: the lowest and the highest MAX_DRAWN / 2, lowest on top.
    """
    accuracy = np.asarray(accuracy, dtype=np.float64)
    if len(accuracy) <= MAX_DRAWN:
        order = np.arange(len(class_names))[::-1]
    else:
        ranked = np.argsort(accuracy, kind="stable")
        order = np.concatenate([ranked[: MAX_DRAWN // 2], ranked[-MAX_DRAWN // 2 :]])[::-1]
    colors = [WRONG if a < accuracy.mean() - 0.1 else RIGHT for a in accuracy[order]]
    ax.barh(range(len(order)), accuracy[order], color=colors)
    # labels as large as their rows allow (7 to 14 pt): 8 pt was unreadable where report.html
    # scales the 2000-pixel picture down to a page, and the few classes most runs have leave room
    row_points = ax.get_position().height * ax.get_figure().get_figheight() * 72 / len(order)
    size = float(np.clip(0.7 * row_points, 7, 14))
    ax.set_yticks(range(len(order)), [printable(class_names[i]) for i in order], fontsize=size)
    ax.set_xlim(0, 1)
    some = (
        f": the {MAX_DRAWN // 2} lowest and highest of {len(accuracy)} classes"
        if len(order) < len(accuracy)
        else ""
    )
    ax.set_xlabel(f"accuracy (recall) per class{some}")
    for y, a in enumerate(accuracy[order]):
        ax.text(min(a, 0.88) + 0.01, y, f"{a:.3f}", va="center", fontsize=size - 1)
