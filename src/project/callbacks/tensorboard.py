"""Where the monitoring callbacks write: the run's TensorBoard writer."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.tensorboard import SummaryWriter


def writer(trainer: L.Trainer) -> SummaryWriter | None:
    """The SummaryWriter of the trainer's TensorBoardLogger on rank 0; None without one."""
    if not trainer.is_global_zero:
        return None
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    return None
