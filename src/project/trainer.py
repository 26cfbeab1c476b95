"""The Lightning Trainer plus `export` and `memory` methods, which LightningCLI turns into subcommands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.plugins.io import CheckpointIO

from project import memory
from project.checkpoint_io import AtomicCheckpointIO
from project.export import export_checkpoint


class Trainer(L.Trainer):
    """lightning.Trainer with atomic checkpoint files, `export` (ONNX + .pt2, verified) and `memory`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        plugins = kwargs.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):  # a user's own CheckpointIO wins
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        super().__init__(*args, **kwargs)

    def memory(self, model: L.LightningModule, datamodule: L.LightningDataModule) -> None:
        """Print the memory one training step needs at the configured batch size and precision, and advice.

        Args:
            model: The model as `fit` would build it.
            datamodule: Gives the batch size and image size.
        """
        budget = memory.measure(model, self, datamodule.batch_size, datamodule.image_size)
        print(memory.report(budget, self.accumulate_grad_batches))

    def export(
        self,
        model: L.LightningModule,
        datamodule: L.LightningDataModule | None = None,
        ckpt_path: str | None = None,
        output_dir: str | None = None,
        opset: int = 18,
    ) -> None:
        """Export a checkpoint to ONNX and .pt2, verified against PyTorch, with a JSON sidecar.

        Args:
            model: Unused (the checkpoint holds the model); LightningCLI passes it.
            datamodule: Its validation images, when it has any on disk, are used for verification.
            ckpt_path: The checkpoint to export.
            output_dir: Where to write; default: next to the checkpoint.
            opset: ONNX opset version.
        """
        images = validation_images(datamodule)
        result = export_checkpoint(ckpt_path, images=images, output_dir=output_dir, opset=opset)
        print(f"Exported {result.onnx}\n         {result.pt2}\n         {result.sidecar}")


def validation_images(datamodule: L.LightningDataModule | None, count: int = 7) -> list[Path]:
    """A few validation files to verify exports on, or none when the data is not on disk."""
    root = getattr(datamodule, "root", None)
    if root is None or not Path(root).is_dir():
        return []
    index = datamodule.splits["val"]
    step = max(1, len(index) // count)
    return [index.path(i) for i in range(0, len(index), step)][:count]
