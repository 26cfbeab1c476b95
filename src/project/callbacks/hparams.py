"""Compare runs in TensorBoard's hparams view: each run's hyperparameters next to its final metrics."""

from __future__ import annotations

import lightning as L

# private Lightning API, checked against lightning 2.6 (the pin is <2.7)
from lightning.fabric.utilities.logger import _flatten_dict
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.tensorboard.summary import hparams
from typing_extensions import override

from project.callbacks.tensorboard import writer

# Metric columns: the run-level scalars (train/loss, val/acc, time/epoch_s, ...), not per-class or lr tags.
METRIC_GROUPS = ("train", "val", "test", "time")


class HParams(Callback):
    """When fit ends, register the run in the hparams view: the model's and data's hyperparameters
    (as Lightning logs them) plus the trainer's main settings, with every run-level scalar as a metric.

    The metric columns name the scalar tags already logged, so TensorBoard shows their last values:
    nothing is logged twice (the logger's own hparams metrics would add a point at step 0).
    """

    def __init__(self, enabled: bool = True) -> None:
        """
        Args:
            enabled: Write the hparams summary when fit ends.
        """
        self.enabled = enabled

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        tensorboard = writer(trainer) if self.enabled else None
        logger = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        if tensorboard is None or logger is None:
            return
        metrics = sorted(
            tag
            for tag in trainer.logged_metrics
            if tag.count("/") == 1 and tag.split("/")[0] in METRIC_GROUPS
        )
        params = {
            **{key: value for key, value in logger.hparams.items() if not key.startswith("_")},
            "trainer": {
                "max_epochs": trainer.max_epochs,
                "precision": trainer.precision,
                "accumulate_grad_batches": trainer.accumulate_grad_batches,
                "gradient_clip_val": trainer.gradient_clip_val,
                "world_size": trainer.world_size,
            },
        }
        # the same flattening and sanitizing as the logger's own log_hyperparams (_sanitize_params is a
        # private Lightning API, checked against lightning 2.6 (the pin is <2.7); _get_file_writer, torch's)
        params = logger._sanitize_params(_flatten_dict(params))
        for summary in hparams(params, dict.fromkeys(metrics, 0.0)):
            tensorboard._get_file_writer().add_summary(summary)
        tensorboard.flush()
