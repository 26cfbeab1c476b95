"""TensorBoard opens on what matters: a Custom Scalars layout with accuracy and loss first.

The Scalars tab sorts its groups by name (`epoch`, `grad_norm`, `lr-AdamW`, `time`, `train`, `val`, ...),
so `val/acc` is near the bottom; renaming the tags would change every monitor name and checkpoint
file name. The layout adds a Custom Scalars tab instead, with train and validation loss on one chart.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from project.callbacks.tensorboard import writer

# category -> chart title -> the tags it draws, in TensorBoard's `add_custom_scalars` form
LAYOUT = {
    "1. what matters": {
        "accuracy (val/acc, val/acc_best)": ["Multiline", ["val/acc", "val/acc_best"]],
        "loss (train/loss, val/loss)": ["Multiline", ["train/loss", "val/loss"]],
    },
    "2. more validation metrics": {
        "balanced accuracy, F1, top-5": ["Multiline", ["val/balanced_acc", "val/f1_macro", "val/top5_acc"]],
        "per class accuracy": ["Multiline", [r"val_class_acc/.*"]],  # room: pictures
    },
    "3. optimization": {
        "learning rate": ["Multiline", [r"lr-.*"]],
        "gradient norm": ["Multiline", ["grad_norm/total"]],
        "speed (images/s)": ["Multiline", ["train/images_per_sec"]],
    },
}


class ScalarsLayout(Callback):
    """Writes LAYOUT into the run's TensorBoard events when fit starts (rank 0, TensorBoard only)."""

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        tensorboard = writer(trainer)
        if tensorboard is not None:
            tensorboard.add_custom_scalars(LAYOUT)
