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
    # Lightning's own pick (the steepest fall against the linear rate) lands where the rates are smallest,
    # on batch noise: it only tells that the curve is long enough; the rate is the descent's steepest point
    suggestion, warning = suggested_rate(finder.results["lr"], finder.results["loss"])
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
    """The finder's curve with the rate the command prints marked (Lightning's own mark would point to its
    own pick)."""
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

    Lightning keeps avg = beta x avg + (1 - beta) x loss and records avg / (1 - beta^(step + 1)) after the
    optimizer step, when `step` (global_step) already counts it: entry i (from 0) is divided by
    1 - beta^(i + 2) where its average holds 1 - beta^k of the weight, k being the losses averaged so far.
    Its first point is half the first batch's loss (x 1 / (1 + beta)), and the curve climbs from there
    for some 50 steps at rates that change nothing: a model that had not learnt yet got 1e-6, the first
    rate tried, suggested. Here entry i is multiplied by (1 - beta^(i + 2)) / (1 - beta^k). A NaN entry
    (a step whose training_step gave no loss) still counts a step and adds nothing to the average.
    Each entry is one optimizer step: with --trainer.accumulate_grad_batches, an epoch whose batches are
    not a multiple of it steps once more than it records, and the correction is then slightly off.
    """
    out, k = [], 0
    for i, loss in enumerate(losses):
        if math.isnan(loss):
            out.append(loss)
            continue
        k += 1
        out.append(loss * (1 - beta ** (i + 2)) / (1 - beta**k))
    return out


# the first steps of the curve left out when looking for the loss's descent and its minimum (at most a
# fifth of the curve): there the debiased average holds fewer than 20 batches, and their spread (on the
# shapes, a batch's loss varies by +-0.3) makes falls as steep as a model's real one
SKIP_BEGIN = 20
# a descent smaller than this share of the loss is no descent: bare `lr_find` on the shapes falls by 0.7%
# (1.79 to 1.78) past its first steps, and a rate read from such a curve is noise (a tenth of its
# minimum's rate, 2.6e-4, trained to val/acc 0.60 in the default 4 epochs, where 2e-3 reaches 0.98)
FLAT_FALL = 0.05


def suggested_rate(lrs: list[float], losses: list[float]) -> tuple[float, str | None]:
    """The rate where the (debiased) loss falls fastest against log(rate) on its descent to its minimum,
    and a warning where the curve gives no such descent.

    The descent runs from the highest point before the minimum to the minimum, both looked for past the
    first SKIP_BEGIN steps: the steepest point anywhere else is a wiggle of batch noise at rates too
    small to change anything, or the rise past the minimum, where training diverges. A descent of fewer
    than 3 points has no steepest point to read: then a tenth of the minimum's rate, the usual rule of
    thumb (the smallest rate tried where the loss only rose).
    """
    loss, rates = np.asarray(losses, dtype=float), np.asarray(lrs, dtype=float)
    finite = np.flatnonzero(np.isfinite(loss))  # a NaN loss makes every later average NaN
    start = min(SKIP_BEGIN, len(loss) // 5, int(finite[-1]))
    best = start + int(np.nanargmin(loss[start:]))
    peak = start + int(np.nanargmax(loss[start : best + 1]))
    fall = (loss[peak] - loss[best]) / abs(loss[peak])
    flat = (
        f"The loss fell by only {fall:.1%} on its way to its minimum ({loss[peak]:.3g} to {loss[best]:.3g} "
        f"past the first {start} steps): {len(loss)} steps are too few to show where this model learns, so "
        "the rate is a guess; raise --num_training, or keep the config's rate."
    )
    if best - peak >= 2:
        # the fall over a window of +-w steps (a twentieth of the curve: 0.3 decades of 100 steps over 6)
        # against log(rate), so that one batch's wiggle is not the steepest point
        w = max(1, len(loss) // 20)
        at = np.arange(peak, best + 1)
        lo, hi = np.maximum(at - w, peak), np.minimum(at + w, best)
        slope = (loss[hi] - loss[lo]) / np.maximum(np.log(rates[hi]) - np.log(rates[lo]), 1e-12)
        steepest = peak + int(np.nanargmin(slope))
        return float(rates[steepest]), flat if fall < FLAT_FALL else None
    if best == start:
        return float(rates[0]), (
            f"the loss rose from the first rates tried: using the smallest rate, {rates[0]:.1e}; a lower "
            "--min_lr would show where it falls. Check the plot."
        )
    fallback = max(float(rates[best]) / 10, float(rates[0]))  # not below the range tried
    return fallback, (
        f"the loss's descent to its minimum at {rates[best]:.1e} is too short to read its steepest point: "
        f"using a tenth of that rate, {fallback:.1e}. Check the plot, and rerun with a larger --num_training "
        "for a smoother curve."
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
