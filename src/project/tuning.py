"""The learning-rate finder and the batch-size finder: Lightning's Tuner, reported as the flag to pass."""

from __future__ import annotations

import io
import math
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
from lightning.pytorch.tuner import Tuner

from project.atomic import atomic_write
from project.checkpoint_io import TUNER_FILE
from project.errors import UserError

if TYPE_CHECKING:
    # the finder's type: private Lightning API, checked against lightning 2.6 (the pin is <2.7)
    from lightning.pytorch.tuner.lr_finder import _LRFinder

LR_FLAG = "--model.optimizer.init_args.lr"
PLOT = "lr_find.png"


def find_lr(
    trainer: L.Trainer,
    model: L.LightningModule,
    datamodule: L.LightningDataModule,
    folder: Path,
    fit_args: list[str],
    min_lr: float,
    max_lr: float,
    num_training: int,
) -> float:
    """Run the range test, write `folder/lr_find.png`, print the suggestion and the fit command using it."""
    if not 0 < min_lr < max_lr:
        raise UserError(
            f"lr_find needs 0 < --min_lr < --max_lr; got --min_lr={min_lr} --max_lr={max_lr}.",
            "e.g. --min_lr=1e-6 --max_lr=1.",
        )
    with no_temporary_files(trainer):
        finder = Tuner(trainer).lr_find(
            model,
            datamodule=datamodule,
            min_lr=min_lr,
            max_lr=max_lr,
            num_training=num_training,
            update_attr=False,
        )
    if finder is not None:
        finder.results["loss"] = debiased(finder.results["loss"])
    suggestion = finder.suggestion() if finder is not None else None
    if suggestion is None:
        steps = len(finder.results.get("lr", [])) if finder is not None else 0
        raise UserError(
            f"The learning-rate finder recorded too few steps ({steps}) to suggest a value: "
            "the loss diverged at once or the data has too few batches.",
            "raise --num_training, lower --min_lr, or use a smaller --data.batch_size.",
        )
    suggestion, warning = checked_suggestion(finder.results["lr"], finder.results["loss"], suggestion)
    if warning is not None:
        print(f"Warning: {warning}")
    png = folder / PLOT
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(png, lr_plot(finder, suggestion))
    print(f"Suggested learning rate: {suggestion:.1e}")
    print(f"Use it: {fit_command(fit_args, f'{LR_FLAG}={suggestion:.2g}')}")
    print(f"Loss against learning rate: {png}")
    return suggestion


def lr_plot(finder: _LRFinder, suggestion: float) -> bytes:
    """The finder's loss against learning rate, as a PNG, titled with the suggestion and marking it."""
    import matplotlib.pyplot as plt

    from project.figures import plain_text

    with plain_text():  # text, neither mathtext nor LaTeX (a matplotlibrc's usetex)
        figure = lr_figure(finder, suggestion)
        image = io.BytesIO()
        figure.savefig(image, format="png", dpi=100)
    plt.close(figure)
    return image.getvalue()


def lr_figure(finder: _LRFinder, suggestion: float) -> Any:
    """The finder's curve with the rate the command prints marked (where checked_suggestion moved it,
    Lightning's own mark would point elsewhere)."""
    from project.figures import plain_ticks

    figure = plain_ticks(finder.plot(suggest=False))
    axis = figure.axes[0]
    lrs, losses = np.asarray(finder.results["lr"]), np.asarray(finder.results["loss"])
    at = int(np.argmin(np.abs(np.log(lrs) - math.log(suggestion))))
    axis.plot(lrs[at], losses[at], marker="o", markersize=10, color="red", label="suggested")
    axis.set_title(f"Suggested learning rate {suggestion:.1e}")
    return figure


SMOOTHING = 0.98  # the beta of Lightning's _LRCallback, whose smoothed losses `debiased` corrects


def debiased(losses: list[float], beta: float = SMOOTHING) -> list[float]:
    """The range test's smoothed losses with the start-up bias taken out.

    Lightning records avg / (1 - beta^(step + 1)) after the optimizer step, when `step` (global_step)
    already counts it: the k-th loss (k from 1) is divided by 1 - beta^(k + 1) where its average holds
    1 - beta^k of the weight. Its first point is half the first batch's loss (x 1 / (1 + beta)), and the
    curve climbs from there for some 50 steps at rates that change nothing (Lightning's issue 14167): a
    model that had not learnt yet got 1e-6, the first rate tried, suggested. Here each k-th loss is
    multiplied by (1 - beta^(k + 1)) / (1 - beta^k); NaN entries (no loss: no step) are kept as they are.
    """
    out, k = [], 0
    for loss in losses:
        if math.isnan(loss):
            out.append(loss)
            continue
        k += 1
        out.append(loss * (1 - beta ** (k + 1)) / (1 - beta**k))
    return out


# the first steps of the curve left out when looking for the loss's descent and its minimum (at most a
# fifth of the curve): there the debiased average holds fewer than 20 batches, and their spread (on the
# shapes, a batch's loss varies by +-0.3) makes falls as steep as a model's real one (Lightning skips 10)
SKIP_BEGIN = 20
# a descent smaller than this share of the loss is no descent: bare `lr_find` on the shapes fell 0.8%
# (1.795 to 1.78) in 100 steps, and the rate it then suggested (2.6e-4) trained to val/acc 0.60 in the
# default 4 epochs, where the config's 2e-3 reaches 0.98
FLAT_FALL = 0.05


def checked_suggestion(lrs: list[float], losses: list[float], suggestion: float) -> tuple[float, str | None]:
    """Lightning's suggestion (the steepest fall of the smoothed loss) if it lies on the loss's descent to
    its minimum; else a tenth of the learning rate at the minimum, and why.

    On a short or noisy range test the steepest point can land past the minimum, on the rising part of
    the curve, where training diverges, or on a wiggle of batch noise at rates too small to change
    anything, with the loss rising again before its real descent; a tenth of the minimum's rate is the
    usual rule of thumb. The descent runs from the highest point before the minimum to the minimum,
    both looked for past the first SKIP_BEGIN steps.
    """
    loss = np.asarray(losses, dtype=float)
    at = int(np.argmin(np.abs(np.log(np.asarray(lrs)) - math.log(suggestion))))
    start = min(SKIP_BEGIN, len(loss) // 5)
    best = start + int(np.nanargmin(loss[start:]))
    peak = start + int(np.nanargmax(loss[start : best + 1]))
    fall = (loss[peak] - loss[best]) / abs(loss[peak])
    flat = (
        f" The loss fell by only {fall:.1%} over the range ({loss[peak]:.3g} to {loss[best]:.3g}): "
        f"{len(loss)} steps are too few to show where this model learns, so the rate is a guess; raise "
        "--num_training, or keep the config's rate."
        if fall < FLAT_FALL
        else ""
    )
    if peak <= at < best and loss[min(at + 1, len(loss) - 1)] < loss[at]:
        return suggestion, flat.strip() or None
    fallback = max(lrs[best] / 10, lrs[0]) if best > start else lrs[0]  # not below the range tried
    if best == start:
        where = (
            f"it rose from the first rates tried); using the smallest rate, {fallback:.1e}, instead, "
            "and a lower --min_lr would show where it falls"
        )
    else:
        where = f"its minimum is at {lrs[best]:.1e}); using a tenth of that, {fallback:.1e}, instead"
    said = (
        f"lies before the loss's descent to its minimum, which starts at {lrs[peak]:.1e} ("
        if at < peak
        else "lies where the loss no longer falls ("
    )
    return fallback, (
        f"the finder's suggestion {suggestion:.1e} {said}{where}. Check the plot, and rerun with a larger "
        f"--num_training for a smoother curve.{flat}"
    )


def find_batch_size(
    trainer: L.Trainer,
    model: L.LightningModule,
    datamodule: L.LightningDataModule,
    fit_args: list[str],
    mode: str,
    init_val: int,
    max_trials: int,
    max_val: int,
    steps_per_trial: int,
) -> int:
    """Grow the batch until it no longer fits (or reaches `max_val`); print the largest that fit."""
    if mode not in ("power", "binsearch"):
        raise UserError(f"batch_size_find: --mode={mode!r} is not a search mode.", "use power or binsearch.")
    with no_temporary_files(trainer):
        found = Tuner(trainer).scale_batch_size(
            model,
            datamodule=datamodule,
            mode=mode,
            init_val=init_val,
            max_trials=max_trials,
            max_val=max_val,
            steps_per_trial=steps_per_trial,
            batch_arg_name="batch_size",
        )
    if found is None:
        raise UserError(
            "The batch-size finder did not run (fast_dev_run skips it).", "leave out fast_dev_run."
        )
    print(f"Largest batch size that fit: {found}")
    if trainer.strategy.root_device.type == "cpu":
        print(
            f"  (on a CPU no out-of-memory error ends the search: it stopped at --max_val={max_val} or after "
            f"--max_trials={max_trials}; a larger batch is not faster per image on a CPU)"
        )
    print(f"Use it: {fit_command(fit_args, f'--data.batch_size={found}')}")
    return found


def fit_command(fit_args: list[str], flag: str) -> str:
    """`python -m project fit` with the user's options, less the finder's own, --name and the option
    that `flag` sets (the value found replaces the one tried), plus `flag`."""
    dropped = (*FINDER_OPTIONS, flag.split("=", 1)[0])
    kept, skip = [], False
    for arg in fit_args:
        option = arg.split("=", 1)[0]
        if skip or option in dropped:
            skip = not skip and "=" not in arg  # `--min_lr 1e-6`: drop the value too
            continue
        kept.append(arg)
    return shlex.join(["python", "-m", "project", "fit", *kept, flag])


# the finders' own options, which fit does not take, and the run name (the finder's run is not fit's)
FINDER_OPTIONS = (
    "--name",
    "--min_lr",
    "--max_lr",
    "--num_training",
    "--mode",
    "--init_val",
    "--max_trials",
    "--max_val",
    "--steps_per_trial",
)


@contextmanager
def no_temporary_files(trainer: L.Trainer) -> Iterator[None]:
    """Remove the Tuner's restore checkpoint, which it leaves behind when a trial or the restore fails."""
    folder = Path(trainer.default_root_dir)
    before = tuner_files(folder)
    try:
        yield
    finally:
        for path in tuner_files(folder) - before:
            path.unlink(missing_ok=True)


def tuner_files(folder: Path) -> set[Path]:
    """The Tuner's restore checkpoints in `folder` (checkpoint_io.TUNER_FILE)."""
    return {path for path in folder.glob(".*.ckpt") if TUNER_FILE.fullmatch(path.name)}
