"""Show what the model is trained on: a grid of augmented training images with their class names."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from project.callbacks.pictures import (
    add_image,
    captioned_grid,
    single_label,  # room: multilabel
)
from project.model import label_names


class TrainingImages(Callback):
    """Log the first training batch of a fit to TensorBoard as `train/images`, captioned with class names.

    Batches are uint8 (normalization happens inside the model), so the grid shows exactly the model's
    input after augmentation: there is nothing to de-normalize.
    """

    def __init__(self, enabled: bool = True, count: int = 32) -> None:
        """
        Args:
            enabled: Log the grid once, at the first training batch of each fit.
            count: How many images of that batch to show.
        """
        self.enabled = enabled
        self.count = count
        self._pending = False

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pending = self.enabled
        self._pending = self._pending and single_label(pl_module)  # room: multilabel

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._pending or batch is None:
            return
        self._pending = False
        images, labels = batch[0][: self.count], batch[1][: self.count]
        # room: recipes begin
        shares = None
        if labels.is_floating_point():  # MixUp/CutMix: caption the dominant class and its share
            shares, labels = labels.max(dim=1)
        # room: recipes end
        names = label_names(pl_module, int(labels.max()) + 1)
        captions = [names[y] for y in labels.tolist()]
        # room: recipes begin
        if shares is not None:
            captions = [f"{c} {s:.0%}" for c, s in zip(captions, shares.tolist(), strict=True)]
        # room: recipes end
        title = f"training batch after augmentation ({images.shape[-1]} px, epoch {trainer.current_epoch})"
        add_image(trainer, "train/images", captioned_grid(images, captions, title=title))
