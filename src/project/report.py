"""A run in one picture, for people who do not run TensorBoard:

    python -m project report RUN [--output PATH.png]

RUN is a run name (a folder in logs/) or the path of a run folder. Reads the run's TensorBoard
event files and writes `report.png` (loss, accuracy, learning rate, throughput, the last
confusion matrix and per-class accuracy) and `report.html` (the pictures and the final metrics)
into the run folder.
When the run has a calibrated export (`checkpoints/<run>/latest.json`), it also writes  # room: calibration
`reliability.png`: the validation split's reliability before and after the temperature.  # room: calibration
When it logged misclassified validation images (the `val/misclassified` grid of
TensorBoard), the last grid goes to `misclassified.png`. report.html shows each picture written.
Needs neither torch nor lightning: tensorboard, numpy and matplotlib.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from project import figures
from project.atomic import atomic_write

# room: calibration begin
from project.deploy.sidecar import Sidecar

# room: calibration end
from project.errors import CommandParser, UserError, exits_on_user_error
from project.runs import (
    CHECKPOINTS,  # room: calibration
    LOGS,
)

CLASS_ACC = "val_class_acc/"
COUNTS = "val/confusion_matrix_counts"
MISCLASSIFIED = "val/misclassified"  # the grid the Misclassified callback logs


@dataclass
class Run:
    """What the report shows of a run: scalar series by tag, the last confusion matrix, the class names."""

    name: str
    scalars: dict[str, tuple[np.ndarray, np.ndarray]]  # tag -> (steps, values)
    counts: np.ndarray | None = None
    counts_step: int | None = None
    class_names: list[str] = field(default_factory=list)
    misclassified: bytes | None = None  # the last grid of misclassified validation images, PNG
    misclassified_step: int | None = None

    def last(self, tag: str) -> float | None:
        return float(self.scalars[tag][1][-1]) if tag in self.scalars else None


def find_run(run: str) -> Path:
    """A run name (logs/<run>) or a run folder's path."""
    for candidate in (LOGS / run, Path(run)):
        if candidate.is_dir():
            return candidate
    runs = sorted((p for p in LOGS.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    known = f" Runs in {LOGS}/: {', '.join(p.name for p in runs[-5:])}." if runs else ""
    raise UserError(
        f"Run '{run}' not found: no folder '{LOGS / run}' or '{run}'.{known}",
        "pass a run name from logs/ or the path of a run folder.",
    )


def read_run(run_dir: Path) -> Run:
    """Scalars and the last confusion matrix from every event file of the run folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not any(run_dir.glob("events.out.tfevents.*")):
        raise UserError(
            f"'{run_dir}' has no TensorBoard event files (events.out.tfevents.*).",
            "pass a run folder that `python -m project fit` wrote into logs/.",
        )
    # 0: keep every scalar; of images, the last one of each tag (a reservoir keeps the newest)
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0, "images": 1})
    events.Reload()
    tags = events.Tags()
    scalars = {}
    for tag in tags["scalars"]:
        points = events.Scalars(tag)
        scalars[tag] = (np.array([p.step for p in points]), np.array([p.value for p in points]))
    if not any(tag.startswith(("train/", "val/")) for tag in scalars):
        raise UserError(
            f"'{run_dir}' has no training or validation metrics yet.",
            "report a run that has finished at least one epoch.",
        )
    run = Run(run_dir.name, scalars)
    # per-class tags are logged in label order, which the event file keeps
    run.class_names = [tag[len(CLASS_ACC) :] for tag in tags["scalars"] if tag.startswith(CLASS_ACC)]
    if COUNTS in tags["tensors"]:
        last = events.Tensors(COUNTS)[-1]
        run.counts, run.counts_step = _counts(run_dir, last.tensor_proto, last.step), last.step
    if MISCLASSIFIED in tags["images"]:
        last = events.Images(MISCLASSIFIED)[-1]
        run.misclassified, run.misclassified_step = last.encoded_image_string, last.step
    return run


def _counts(run_dir: Path, proto: Any, step: int) -> np.ndarray:
    """The confusion-matrix counts of an event file, checked from the declared shape before allocating.

    A tensor's shape is declared apart from its values, and the values are repeated to fill it:
    270 bytes of event file asked for an 18.6 GiB array.
    """
    from tensorboard.util import tensor_util

    shape = [d.size for d in proto.tensor_shape.dim]
    square = len(shape) == 2 and shape[0] == shape[1]
    if not square or not 1 <= shape[0] <= figures.MAX_LOGGED_COUNTS:
        raise UserError(
            f"'{run_dir}': the event files' {COUNTS} at step {step} has the shape {shape}; expected "
            f"[C, C] for C from 1 to {figures.MAX_LOGGED_COUNTS} classes, as fit logs it.",
            "report a run folder that `python -m project fit` wrote (this event file was changed or "
            "written by something else), or remove that event file.",
        )
    try:
        counts = tensor_util.make_ndarray(proto)
    except (ValueError, TypeError) as e:
        raise UserError(
            f"'{run_dir}': the event files' {COUNTS} at step {step} cannot be read: {e}.",
            "report a run folder that `python -m project fit` wrote, or remove that event file.",
        ) from None
    return counts


def draw_report(run: Run) -> Figure:
    """Curves on top, the confusion matrix and per-class accuracy below."""
    figure = Figure(figsize=(20, 11), dpi=100, layout="constrained")
    grid = figure.add_gridspec(2, 4, height_ratios=(1, 1.5))
    _curves(figure.add_subplot(grid[0, 0]), run, ["train/loss", "val/loss"], "loss")
    _curves(figure.add_subplot(grid[0, 1]), run, ["train/acc", "val/acc", "val/f1_macro"], "accuracy")
    lr_tags = sorted(tag for tag in run.scalars if tag.startswith("lr-"))
    _curves(figure.add_subplot(grid[0, 2]), run, lr_tags, "learning rate")
    _curves(figure.add_subplot(grid[0, 3]), run, ["train/images_per_sec"], "training images / s")
    matrix_ax, classes_ax = figure.add_subplot(grid[1, :2]), figure.add_subplot(grid[1, 2:])
    if run.counts is not None:
        numbers = [str(i) for i in range(len(run.counts))]
        names = run.class_names if len(run.class_names) == len(run.counts) else numbers
        figures.draw_confusion_matrix(matrix_ax, run.counts, names, f"validation at step {run.counts_step}:")
    else:
        _empty(
            matrix_ax,
            "no confusion matrix in this run (--confusion_matrix.enabled=true logs it for up to "
            "200 classes; past that TensorBoard has val/top_confusions)",
        )
    if run.class_names:
        accuracy = [run.last(CLASS_ACC + name) for name in run.class_names]
        figures.draw_per_class(classes_ax, accuracy, run.class_names)
        classes_ax.set_title("per-class validation accuracy, last epoch", fontsize=9)
    else:
        _empty(classes_ax, "no per-class accuracy in this run (--confusion_matrix.enabled=true logs it)")
    figure.suptitle(f"run {run.name}: {_summary(run)}", fontsize=13)
    return figure


def _curves(ax: Axes, run: Run, tags: Sequence[str], title: str) -> None:
    shown = [tag for tag in tags if tag in run.scalars]
    if not shown:
        _empty(ax, f"no {title} logged")
        return
    for tag in shown:
        steps, values = run.scalars[tag]
        marker = "o" if len(steps) <= 50 else None  # per-epoch series: one dot per validation
        ax.plot(steps, values, marker=marker, markersize=3, linewidth=1, label=tag)
    ax.set(title=title, xlabel="step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, color="gray", transform=ax.transAxes)
    ax.set_axis_off()


def _summary(run: Run) -> str:
    parts = []
    for tag in ("val/acc", "val/acc_best", "val/loss", "train/loss"):
        value = run.last(tag)
        if value is not None:
            parts.append(f"{tag} {value:.4f}")
    if "epoch" in run.scalars:
        parts.append(f"{int(run.scalars['epoch'][1].max()) + 1} epochs")
    return ", ".join(parts) or "no metrics"


def write_html(run: Run, png: Path, path: Path, more: Sequence[tuple[str, str]] = ()) -> None:
    """A page with the picture, the `more` pictures (file name, heading), the last value of each scalar."""
    pictures = "\n".join(
        f'<h2>{html.escape(heading)}</h2>\n<img src="{html.escape(name)}" alt="{html.escape(heading)}">'
        for name, heading in more
    )
    rows = "\n".join(
        f"<tr><td>{html.escape(tag)}</td><td>{values[-1]:.6g}</td><td>{int(steps[-1])}</td></tr>"
        for tag, (steps, values) in sorted(run.scalars.items())
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Run {html.escape(run.name)}</title>
<style>body{{font-family:sans-serif;margin:2em}} img{{max-width:100%}} h2{{margin-top:1.5em}}
td,th{{padding:2px 12px;text-align:left}} tr:nth-child(even){{background:#f4f4f4}}</style></head>
<body><h1>Run {html.escape(run.name)}</h1>
<p>{html.escape(_summary(run))}</p>
<img src="{html.escape(png.name)}" alt="training curves, confusion matrix and per-class accuracy">
{pictures}
<h2>Last values</h2>
<table><tr><th>metric</th><th>value</th><th>step</th></tr>
{rows}
</table></body></html>
"""
    atomic_write(path, page.encode())


def report(run: str, output: str | None = None) -> Path:
    """Write the PNG and the HTML page of a run; returns the PNG's path."""
    run_dir = find_run(run)
    data = read_run(run_dir)
    png = Path(output) if output else run_dir / "report.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    image = io.BytesIO()
    with figures.plain_text():  # class names and tags are text, never mathtext
        draw_report(data).savefig(image, format="png")
    atomic_write(png, image.getbuffer())
    more = []
    # room: calibration begin
    reliability = png.with_name("reliability.png")
    if write_reliability(CHECKPOINTS / run_dir.name / "latest.json", reliability):
        print(f"Reliability diagram written to {reliability}")
        more.append((reliability.name, "Reliability of the export's probabilities (validation split)"))
    # room: calibration end
    if data.misclassified is not None:
        misclassified = png.with_name("misclassified.png")
        atomic_write(misclassified, data.misclassified)  # the PNG TensorBoard holds, as it is
        heading = f"Misclassified validation images at step {data.misclassified_step} (true → predicted)"
        more.append((misclassified.name, heading))
    write_html(data, png, png.with_suffix(".html"), more)
    return png


# room: calibration begin
def write_reliability(sidecar: Path, png: Path) -> bool:
    """The reliability diagram of the export `sidecar` describes, at `png`; False when it has none.

    A sidecar whose values do not hold (`project.deploy.sidecar.check`) is a UserError naming the key.
    """
    if not sidecar.is_file():
        return False
    export = Sidecar.load(sidecar)
    if export.reliability is None:
        return False
    image = io.BytesIO()
    with figures.plain_text():
        draw_reliability(export).savefig(image, format="png")
    atomic_write(png, image.getbuffer())
    return True


def draw_reliability(export: Sidecar) -> Figure:
    """Accuracy against confidence per bin, before and after the temperature (the diagonal is perfect)."""
    reliability, meta = export.reliability or {}, export.to_dict()
    figure = Figure(figsize=(10, 4.8), dpi=100, layout="constrained")
    edges = np.linspace(0, 1, int(reliability["bins"]) + 1)
    for i, (key, title) in enumerate((("before", "softmax"), ("after", "calibrated"))):
        ax = figure.add_subplot(1, 2, i + 1)
        part = reliability[key]
        shown = np.asarray(part["count"]) > 0
        ax.bar(edges[:-1][shown], np.asarray(part["accuracy"])[shown], width=np.diff(edges)[shown],
               align="edge", edgecolor="black", alpha=0.7, label="accuracy")  # fmt: skip
        ax.plot([0, 1], [0, 1], "--", color="gray", label="perfectly calibrated")
        ax.plot(np.asarray(part["confidence"])[shown], np.asarray(part["accuracy"])[shown], "o", color="C3",
                markersize=3, label="mean confidence")  # fmt: skip
        ece = meta.get(f"ece_{key}")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (top probability)", ylabel="accuracy")
        ax.set_title(f"{title}: ECE {ece:.4f}" if ece is not None else title, fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
    figure.suptitle(
        f"reliability on {meta.get('calibration_images', '?')} validation images, "
        f"temperature {export.temperature:.3f}",
        fontsize=11,
    )
    return figure


# room: calibration end


@exits_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    parser = CommandParser(prog="python -m project report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="run name (a folder in logs/) or path of a run folder")
    parser.add_argument("--output", help="PNG to write (default: report.png in the run folder)")
    args = parser.parse_args(argv)
    png = report(args.run, args.output)
    print(f"Report written to {png} and {png.with_suffix('.html')}")
