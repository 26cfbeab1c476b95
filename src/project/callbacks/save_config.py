"""LightningCLI's SaveConfigCallback, writing the run's config.yaml atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.cli import SaveConfigCallback
from typing_extensions import override

from project.atomic import atomic_write


class AtomicSaveConfig(SaveConfigCallback):
    """Save the resolved config to `<log_dir>/<config_filename>` via a temporary file, fsync and rename."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.save_to_log_dir = False  # the parent's direct write is replaced by save_config below
        self._log_dir: str | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.already_saved:
            self._log_dir = trainer.log_dir  # on every rank: it is a collective call under DDP
        super().setup(trainer, pl_module, stage)

    @override
    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._log_dir is None:
            return
        path = Path(self._log_dir) / self.config_filename
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, self.parser.dump(self.config, skip_none=False).encode())
