"""How training goes in time: images per second, epoch time and time left, also in the progress bar."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, Timer
from lightning.pytorch.trainer.states import RunningStage
from typing_extensions import override


class Throughput(Callback):
    """Log `train/images_per_sec` (over the last `window` batches) and `time/epoch_s` (training plus
    validation) to the loggers, and show `img/s` and `eta_s` (estimated seconds left in the fit) in the
    progress bar, next to the bar's own time left in the epoch.

    Wall-clock time between batches, without synchronizing the device: on a GPU the window average
    is right while single steps are not.
    """

    def __init__(self, enabled: bool = True, window: int = 20) -> None:
        """
        Args:
            enabled: Measure and log throughput, epoch time and time left.
            window: Batches the images/s figure is averaged over.
        """
        self.enabled = enabled
        self.window = window
        self._ends: deque[tuple[float, int]] = deque(maxlen=window + 1)  # (time, images so far)
        self._images = 0
        self._epoch_start = 0.0
        self._validation_start = 0.0
        self._validation_s = 0.0  # the last validation's duration, for the time left

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a fit resumed mid-epoch gets no on_train_epoch_start for that epoch: its time counts from here
        self._epoch_start = time.perf_counter()

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_start = time.perf_counter()
        self._ends.clear()  # the first batch of an epoch waits for the loader workers: not counted

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled or batch is None:
            return
        self._images += len(batch[1])
        self._ends.append((time.perf_counter(), self._images))
        if len(self._ends) < 2:
            return
        (start, first), (end, last) = self._ends[0], self._ends[-1]
        rate = (last - first) / max(end - start, 1e-9)
        pl_module.log("train/images_per_sec", rate, on_step=True, on_epoch=False)
        pl_module.log("img/s", float(round(rate)), prog_bar=True, logger=False, on_step=True, on_epoch=False)
        eta = self._time_left(trainer, (end - start) / (len(self._ends) - 1))
        if eta is not None:
            pl_module.log(
                "eta_s", float(round(eta)), prog_bar=True, logger=False, on_step=True, on_epoch=False
            )

    def _time_left(self, trainer: L.Trainer, batch_s: float) -> float | None:
        """Seconds left in the fit: the batches left at the current pace, plus a validation per epoch left;
        at most the time budget left (--trainer.max_time), which stops the fit first."""
        budget = _budget_left(trainer)
        total = trainer.estimated_stepping_batches * trainer.accumulate_grad_batches
        per_epoch = trainer.num_training_batches
        if not (math.isfinite(total) and math.isfinite(per_epoch)):
            return budget
        batches_left = max(0, total - trainer.global_step * trainer.accumulate_grad_batches)
        # +1: after an epoch's last batch, that epoch's validation is still to come
        every = trainer.check_val_every_n_epoch or 1
        validations_left = math.ceil((batches_left + 1) / max(1, per_epoch) / every)
        pace = batches_left * batch_s + validations_left * self._validation_s
        return pace if budget is None else min(pace, budget)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validation_start = time.perf_counter()

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validation_s = time.perf_counter() - self._validation_start

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled:
            pl_module.log("time/epoch_s", time.perf_counter() - self._epoch_start, on_epoch=True)


def _budget_left(trainer: L.Trainer) -> float | None:
    """Seconds left of --trainer.max_time (Lightning's Timer callback), or None without a budget."""
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    left = timer.time_remaining(RunningStage.TRAINING) if timer is not None else None
    return None if left is None else max(0.0, left)
