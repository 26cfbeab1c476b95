"""Export the best checkpoint when `fit` ends, so a finished run leaves a deployable model."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from typing_extensions import override

from project.export import ExportOptions, export_checkpoint, validation_images


class ExportBest(Callback):
    """After fit: every export target + sidecar of the best checkpoint, verified, next to it (rank 0 only).

    Its options are those of the `export` command (`ExportOptions`), as `--export_best.opset`,
    `--export_best.format`, ...; they are checked when the callback is built, before training.
    """

    def __init__(self, enabled: bool = True, **options: Any) -> None:
        """
        Args:
            enabled: Export when fit ends (`--export_best.enabled=false` turns it off).
            options: The fields of `project.export.ExportOptions` (opset, format, ...).
        """
        self.enabled = enabled
        self.options = ExportOptions(**options)
        self.exported: Path | None = None  # the .onnx written when fit ended (RunSummary prints it)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled or not trainer.is_global_zero or trainer.fast_dev_run:
            return
        checkpoint = trainer.checkpoint_callback
        best = checkpoint.best_model_path if isinstance(checkpoint, ModelCheckpoint) else ""
        if not best:
            return
        result = export_checkpoint(
            best,
            images=validation_images(trainer.datamodule),
            datamodule=trainer.datamodule,
            **asdict(self.options),
        )
        self.exported = result.onnx
