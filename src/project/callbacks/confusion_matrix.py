"""Where the model errs, per class: the confusion matrix and per-class accuracy of every validation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torchmetrics.classification import MulticlassConfusionMatrix
from typing_extensions import override

from project import figures
from project.callbacks.pictures import (
    add_image,
    single_label,  # room: multilabel
    step,
)
from project.callbacks.tensorboard import writer
from project.figures import MAX_LOGGED_COUNTS
from project.model import label_names


class _Counts(MulticlassConfusionMatrix):
    """torchmetrics' confusion matrix (state, reset, synchronization), counted in place: its own update
    builds a classes² bincount per batch, 1 s and 800 MB per batch at 10,000 classes."""

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        # index_put_ with accumulate has a deterministic CUDA implementation (index_add_ does not)
        self.confmat.index_put_((target, preds), torch.ones_like(target), accumulate=True)


class ConfusionMatrix(Callback):
    """After each validation epoch: `val/confusion_matrix` (a figure, rows normalized, with class names),
    `val/confusion_matrix_counts` (the counts, as a tensor, for the report; past MAX_LOGGED_COUNTS
    classes `val/top_confusions`, a text table, instead) and one `val_class_acc/<class>` scalar per
    class. Past `figures.MAX_DRAWN` classes the figure shows the classes of the top confusions.

    The counts accumulate on the model's device and are synchronized across processes by torchmetrics;
    per-class accuracy is read off them (diagonal over row sums).
    Needs `validation_step` to return the logits.
    """

    def __init__(self, enabled: bool = True) -> None:
        """
        Args:
            enabled: Compute and log the confusion matrix and per-class accuracy.
        """
        self.enabled = enabled
        self.matrix: MulticlassConfusionMatrix | None = None
        self._active = False

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._active = self.enabled
        self._active = self._active and single_label(pl_module)  # room: multilabel
        if not self._active:
            return
        if self.matrix is None:
            num_classes = pl_module.hparams["num_classes"]
            self.matrix = _Counts(num_classes)
        self.matrix.to(pl_module.device).reset()

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._active and isinstance(outputs, torch.Tensor) and batch is not None:
            preds = outputs.argmax(dim=1)
            self.matrix.update(preds, batch[1].long())

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._active or trainer.sanity_checking or self.matrix.update_count == 0:
            return
        counts = self.matrix.compute()  # on every rank: torchmetrics synchronizes the counts
        accuracy = counts.diag() / counts.sum(dim=1).clamp_min(1)  # per-class accuracy (recall), 0 if absent
        names = label_names(pl_module, len(counts))
        for name, value in zip(names, accuracy, strict=True):
            pl_module.log(f"val_class_acc/{name}", value, sync_dist=False)  # already synchronized
        tensorboard = writer(trainer)
        if tensorboard is not None:
            counts = counts.cpu()
            if len(counts) <= MAX_LOGGED_COUNTS:
                tensorboard.add_tensor("val/confusion_matrix_counts", counts, step(trainer))
            else:  # classes² numbers every epoch would swamp the event file: the top confusions instead
                table = top_confusions_table(counts.numpy(), names)
                tensorboard.add_text("val/top_confusions", "```\n" + table + "\n```", step(trainer))
            title = f"validation, epoch {trainer.current_epoch}:"
            add_image(trainer, "val/confusion_matrix", figures.confusion_matrix(counts, names, title))


def top_confusions_table(counts: np.ndarray, names: Sequence[str], k: int = 20) -> str:
    """The `k` most frequent (true, predicted) pairs of different classes, one line each."""
    rows = counts.sum(axis=1)
    lines = [f"{'count':>7} {'of true':>7}  true -> predicted"]
    for true, predicted, n in figures.top_confusions(counts, k):
        lines.append(f"{n:>7} {n / rows[true]:>7.1%}  {names[true]} -> {names[predicted]}")
    return "\n".join(lines)
