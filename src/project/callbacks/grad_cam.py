"""GradCam: a Grad-CAM overlay per image `predict` answers (`--explain.dir=DIR`), for error analysis.

The overlay is written as `<DIR>/<image's path>.cam.png`, beside nothing else: the predictions CSV is
PredictionWriter's. The heat maps are project.explain's (pytorch-grad-cam, the `explain` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from project.callbacks.prediction_writer import relative_name


class GradCam(Callback):
    """Writes the Grad-CAM overlay of each predicted image's predicted class."""

    def __init__(self, dir: str | None = None) -> None:
        """
        Args:
            dir: Write a Grad-CAM overlay per image here (`<file>.cam.png`); null: none.
        """
        self.dir = Path(dir) if dir else None
        self._explainer: Any = None

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.dir is None:
            return
        from project.explain import Explainer

        self._explainer = Explainer(pl_module.normalize, pl_module.net, pl_module.hparams.backbone)

    @override
    def on_predict_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._explainer is None or outputs is None:  # None: every image of the batch was bad
            return
        dataset = trainer.predict_dataloaders.dataset
        names = [relative_name(dataset.files[i], dataset.root) for i in batch[1].tolist()]
        self._explainer.write(batch[0], names, self.dir)
