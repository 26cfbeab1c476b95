"""How long the audit's folds will take, said before they start, and fold defaults sized to the device.

A copy of the model trains two epochs of two batches from the real loader, with the folds' own trainer
settings: the time between batches of one epoch is the step time, the longer gap across the epochs adds
what each epoch starts with (its loader workers), and the time to the first batch what each fold starts
with (a trainer, the first batch's warm-up). Predicting every image (forward only) counts a third of a
training step per batch. On a CPU the defaults shrink: 3 folds instead of 5, and the epochs of the
images-seen rule lowered (not below MIN_EPOCHS) until the folds fit in about CPU_BUDGET_S; an accelerator
keeps the rule. Values the user passes are kept as they are.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import lightning as L
import numpy as np
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import Callback
from torch.utils.data import Dataset
from typing_extensions import override

from project.audit.folds import MIN_EPOCHS, Recipe, fold_loader, fold_trainer, quiet_lightning

FOLDS, CPU_FOLDS = 5, 3
CPU_BUDGET_S = 300.0  # a CPU audit with the default folds and epochs aims to train for about 5 minutes
MEASURED_EPOCHS, MEASURED_BATCHES = 2, 2  # four training batches: two within epochs, one across
PREDICT_SHARE = 1 / 3  # a prediction batch against a training step: forward only


class _Clock(Callback):
    """When the fit started and when each training batch ended, with its epoch."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.ends: list[tuple[int, float]] = []

    @override
    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.ends.append((trainer.current_epoch, time.perf_counter()))


@dataclass(frozen=True)
class StepTime:
    """Measured on the folds' device: seconds per training batch of `batch_size` images, the extra seconds
    each epoch starts with (its loader workers), and those each fold starts with (trainer, first batch)."""

    seconds: float
    batch_size: int
    on_cpu: bool
    epoch_start: float = 0.0
    fold_start: float = 0.0


def measure_step(model: L.LightningModule, train_data: Dataset, rows: np.ndarray, recipe: Recipe) -> StepTime:
    """Train a throw-away copy of `model` for two epochs of two batches: step, epoch and fold start times."""
    clock = _Clock()
    short = replace(recipe, epochs=MEASURED_EPOCHS)
    with quiet_lightning():
        trainer = fold_trainer(short, None, clock, limit_train_batches=MEASURED_BATCHES)
        loader = fold_loader(train_data, rows, recipe, training=True)
        trainer.fit(copy.deepcopy(model), train_dataloaders=loader)
    pairs = list(itertools.pairwise(clock.ends))
    within = [b - a for (ea, a), (eb, b) in pairs if ea == eb]
    across = [b - a for (ea, a), (eb, b) in pairs if ea != eb]
    first = clock.ends[0][1] - clock.started if clock.ends else time.perf_counter() - clock.started
    step = float(np.mean(within)) if within else float(np.mean(across)) if across else first
    epoch_start = max(0.0, float(np.mean(across)) - step) if across else 0.0
    fold_start = max(0.0, first - step)
    on_cpu = isinstance(trainer.accelerator, CPUAccelerator)
    return StepTime(step, recipe.batch_size, on_cpu, epoch_start, fold_start)


def runs_on_cpu(recipe: Recipe) -> bool:
    """Whether the folds' trainer (`--trainer.accelerator`, auto by default) would train on the CPU."""
    with quiet_lightning():
        return isinstance(fold_trainer(recipe, None).accelerator, CPUAccelerator)


def default_folds(on_cpu: bool) -> int:
    return CPU_FOLDS if on_cpu else FOLDS


def batches_per_epoch(train_images: int, recipe: Recipe) -> int:
    """Training batches of one fold's epoch, as the fold's loader and trainer make them."""
    full = train_images // recipe.batch_size if train_images > recipe.batch_size else 1  # drop_last
    limit = recipe.trainer_kwargs.get("limit_train_batches")
    if isinstance(limit, int) and not isinstance(limit, bool):
        return max(1, min(full, limit))
    if isinstance(limit, float):
        return max(1, int(full * limit))
    return full


@dataclass(frozen=True)
class Plan:
    """The folds about to train and how long they will take."""

    folds: int
    epochs: int
    train_images: int  # per fold
    images: int  # every readable image, predicted once per fold
    step: StepTime
    recipe: Recipe
    rule_epochs: int  # what the images-seen rule asked for
    epochs_given: bool

    def seconds_per_epoch(self) -> float:
        return self.step.epoch_start + batches_per_epoch(self.train_images, self.recipe) * self.step.seconds

    def seconds(self) -> float:
        """The estimated time of all folds: starting, training, and predicting every image."""
        batches = math.ceil(self.images / self.recipe.batch_size)
        predict = self.step.epoch_start + batches * self.step.seconds * PREDICT_SHARE
        return self.folds * (self.step.fold_start + self.epochs * self.seconds_per_epoch() + predict)

    def describe(self, now: datetime | None = None) -> str:
        """What the audit says before it trains: the folds, the estimate, why the epochs are what they are."""
        seconds = self.seconds()
        until = (now or datetime.now()) + timedelta(seconds=seconds)
        device = "CPU" if self.step.on_cpu else "accelerator"
        lines = [
            f"Training {self.folds} folds x {self.epochs} epoch{'s' * (self.epochs != 1)} on "
            f"{self.train_images:,} images each: "
            f"about {duration(seconds)} (until {until:%H:%M}; measured {self.step.seconds:.2f} s per batch "
            f"of {self.step.batch_size} on the {device})."
        ]
        if not self.epochs_given and self.epochs < self.rule_epochs:
            lines.append(
                f"  On a CPU the default is {self.epochs} epochs instead of {self.rule_epochs}, to stay near "
                f"{duration(CPU_BUDGET_S)}; --epochs={self.rule_epochs} trains them all."
            )
        if seconds > 2 * CPU_BUDGET_S:
            fewer = f"--epochs={MIN_EPOCHS}, " if self.epochs > MIN_EPOCHS else ""
            lines.append(
                f"  Shorter: --folds=2, {fewer}a smaller --data.image_size or --model.backbone, fewer "
                "images, or a GPU. Ctrl-C stops the audit at once, leaving nothing half-written."
            )
        return "\n".join(lines)


def plan_folds(
    step: StepTime,
    folds: int,
    epochs: int | None,
    rule_epochs: int,
    train_images: int,
    images: int,
    recipe: Recipe,
) -> Plan:
    """The epochs the folds train: the user's, the rule's, or on a CPU as many as fit CPU_BUDGET_S."""
    given = epochs is not None
    plan = Plan(folds, epochs or rule_epochs, train_images, images, step, recipe, rule_epochs, given)
    if given or not step.on_cpu:
        return plan
    per_epoch = folds * plan.seconds_per_epoch()
    predict = plan.seconds() - plan.epochs * per_epoch
    fitting = int((CPU_BUDGET_S - predict) // per_epoch) if per_epoch > 0 else rule_epochs
    return replace(plan, epochs=max(MIN_EPOCHS, min(rule_epochs, fitting)))


def duration(seconds: float) -> str:
    """'40 s', '3 min', '1 h 20 min': a rough time for a person."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"
