"""Export the best checkpoint when `fit` ends, so a finished run leaves a deployable model."""

from __future__ import annotations

from typing import Literal

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from typing_extensions import override

from project.deploy.calibration import DEFAULT_ACCEPT
from project.export import export_checkpoint, validation_images


class ExportBest(Callback):
    """After fit: ONNX + .pt2 + sidecar of the best checkpoint, verified, next to it (rank 0 only)."""

    def __init__(
        self,
        enabled: bool = True,
        opset: int = 18,
        unknown_accept: float | None = DEFAULT_ACCEPT,
        unknown_score: Literal["energy", "max_probability"] = "energy",
        quantize: Literal["int8"] | None = None,
    ) -> None:
        """
        Args:
            enabled: Export when fit ends (`--export_best.enabled=false` turns it off).
            opset: ONNX opset version.
            unknown_accept: Share of validation images the unknown threshold accepts; below it
                infer/serve/predict answer `unknown`. 0 or null: no rejection.
            unknown_score: What the threshold applies to: `energy` or `max_probability`.
            quantize: `int8`: also write `<name>-int8.onnx` (static quantization), measured.
        """
        self.enabled = enabled
        self.opset = opset
        self.unknown_accept = unknown_accept
        self.unknown_score = unknown_score
        self.quantize = quantize

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
            opset=self.opset,
            datamodule=trainer.datamodule,
            unknown_accept=self.unknown_accept,
            unknown_score=self.unknown_score,
            quantize=self.quantize,
        )
        print(f"Exported the best checkpoint to {result.onnx} and {result.pt2}")
