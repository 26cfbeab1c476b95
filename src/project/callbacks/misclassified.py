"""Show where the model errs: validation images it gets wrong, with the true and the predicted class."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from project.callbacks.pictures import (
    add_image,
    captioned_grid,
    single_label,  # room: multilabel
)
from project.figures import WRONG
from project.model import label_names


class Misclassified(Callback):
    """After each validation epoch: `val/misclassified`, the first `count` wrong validation images
    (in data order, so the same images can be followed from epoch to epoch), captioned
    `true → predicted probability`. Rank 0 looks at its own share of the data only.

    Needs `validation_step` to return the logits. Once `count` images are found, batches cost nothing.
    """

    def __init__(self, enabled: bool = True, count: int = 24) -> None:
        """
        Args:
            enabled: Log the grid of misclassified validation images.
            count: How many images to show at most.
        """
        self.enabled = enabled
        self.count = count
        self._found: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._missing = 0

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        on = self.enabled and trainer.is_global_zero
        on = on and single_label(pl_module)  # room: multilabel
        self._found, self._missing = [], self.count if on else 0

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
        if self._missing <= 0 or not isinstance(outputs, torch.Tensor) or batch is None:
            return
        probabilities, preds = outputs.detach().float().softmax(dim=1).max(dim=1)
        wrong = (preds != batch[1]).nonzero().flatten()[: self._missing]
        if len(wrong):
            self._found.append(
                tuple(t[wrong].cpu() for t in (batch[0], batch[1], preds, probabilities))  # type: ignore[arg-type]
            )
            self._missing -= len(wrong)

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._found or trainer.sanity_checking:
            return
        images, labels, preds, probabilities = (torch.cat(parts) for parts in zip(*self._found, strict=True))
        count = int(max(labels.max(), preds.max())) + 1
        names = label_names(pl_module, count)
        captions = [
            f"{names[t]}\n→ {names[p]} {q:.2f}"
            for t, p, q in zip(labels.tolist(), preds.tolist(), probabilities.tolist(), strict=True)
        ]
        title = f"misclassified validation images, epoch {trainer.current_epoch} (true → predicted)"
        grid = captioned_grid(images, captions, [WRONG] * len(captions), title=title)
        add_image(trainer, "val/misclassified", grid)
        self._found = []
