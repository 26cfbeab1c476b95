"""Export the best checkpoint when `fit` ends, so a finished run leaves a deployable model."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from typing_extensions import override

from project.export import export_checkpoint, validation_images


class ExportBest(Callback):
    """After fit: ONNX + .pt2 + sidecar of the best checkpoint, verified, next to it (rank 0 only)."""

    def __init__(self, enabled: bool = True, opset: int = 18) -> None:
        """
        Args:
            enabled: Export when fit ends (`--export_best.enabled=false` turns it off).
            opset: ONNX opset version.
        """
        self.enabled = enabled
        self.opset = opset

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled or not trainer.is_global_zero or trainer.fast_dev_run:
            return
        checkpoint = trainer.checkpoint_callback
        best = checkpoint.best_model_path if isinstance(checkpoint, ModelCheckpoint) else ""
        if not best:
            return
        result = export_checkpoint(best, images=validation_images(trainer.datamodule), opset=self.opset)
        print(f"Exported the best checkpoint to {result.onnx} and {result.pt2}")
