"""When fit's output goes to a file or a pipe: one line per epoch instead of a progress bar.

TQDM redraws its bar with carriage returns; in a log file that is one line of tens of kilobytes.
"""

from __future__ import annotations

import time

import lightning as L
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar
from typing_extensions import override

# the scalars a line shows, in this order, when the run logged them
SHOWN = ("train/loss", "val/loss", "val/acc")


class EpochLines(ProgressBar):
    """A progress bar for logs: `epoch 2/4: train/loss 1.23  val/loss 0.98  val/acc 0.750  (12.3 s)`."""

    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._started = 0.0

    @override
    def disable(self) -> None:
        self._enabled = False

    @override
    def enable(self) -> None:
        self._enabled = True

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.monotonic()

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._enabled or not trainer.is_global_zero or trainer.sanity_checking:
            return
        print(epoch_line(trainer, time.monotonic() - self._started), flush=True)


def epoch_line(trainer: L.Trainer, seconds: float) -> str:
    """`epoch N/M: ` and the SHOWN scalars the trainer has, with the epoch's time."""
    metrics = trainer.callback_metrics
    last = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else "?"
    values = "  ".join(f"{name} {float(metrics[name]):.4g}" for name in SHOWN if name in metrics)
    return f"epoch {trainer.current_epoch + 1}/{last}: {values}  ({seconds:.1f} s)"
