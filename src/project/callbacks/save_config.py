"""LightningCLI's SaveConfigCallback, writing the run's config.yaml atomically and without credentials, and
giving every other logger (the experiment trackers) the same configuration as flat parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger  # room: trackers
from typing_extensions import override

from project.atomic import atomic_write
from project.terminal import without_credentials

# room: trackers begin
from project.trackers import flat_params

# room: trackers end


class AtomicSaveConfig(SaveConfigCallback):
    """Save the resolved config to `<log_dir>/<config_filename>` via a temporary file, fsync and rename;
    log it, flat (`model.backbone`, `trainer.max_epochs`, ...), to every logger but TensorBoard (whose
    hparams view is project.callbacks.HParams). A URL's `user:password@` is written in neither."""

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
        # room: trackers begin
        trackers = [lg for lg in trainer.loggers if not isinstance(lg, TensorBoardLogger)]
        if trackers and trainer.is_global_zero:
            params = flat_params(self.config)
            for logger in trackers:
                logger.log_hyperparams(params)
                # the flat configuration holds the model's and the data's hyperparameters: Lightning's own
                # call after setup would log them again under other names (nested, with private keys)
                logger.log_hyperparams = _logged_already
        # room: trackers end
        if self._log_dir is None:
            return
        path = Path(self._log_dir) / self.config_filename
        path.parent.mkdir(parents=True, exist_ok=True)
        text = without_credentials(self.parser.dump(self.config, skip_none=False))
        atomic_write(path, text.encode())


# room: trackers begin
def _logged_already(*args: Any, **kwargs: Any) -> None:
    """A tracker's log_hyperparams once the configuration is logged."""


# room: trackers end
