"""A run from shards stopped mid-epoch resumes with the samples that epoch has not seen yet (issue 33)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from typing_extensions import override

from project.optimize import main as optimize
from tests.helpers import exit_status
from tests.shard_files import Recorder, WithIds

pytest.importorskip("litdata")


class Killed(RuntimeError):
    pass


class KillAt(Callback):
    """Dies before training batch `index`, as a killed process would (its last checkpoint: a step before)."""

    def __init__(self, index: int) -> None:
        self.index = index

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, module: L.LightningModule, batch: object, i: int
    ) -> None:
        if i == self.index:
            raise Killed


def trainer(folder: Path, *callbacks: Callback) -> L.Trainer:
    every_step = ModelCheckpoint(folder, every_n_train_steps=1, save_last=True)
    return L.Trainer(
        max_epochs=1, default_root_dir=folder, limit_val_batches=0, logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[every_step, *callbacks],
    )  # fmt: skip


@pytest.mark.slow
def test_resume_mid_epoch_sees_each_remaining_sample_once(shapes_root: Path, tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    assert exit_status(optimize, f"--data.root={shapes_root}", f"--output={shards}", "--workers=1") == 0
    data = {"root": str(shards), "image_size": 32, "batch_size": 8, "num_workers": 2}
    first = Recorder()
    with pytest.raises(Killed):
        trainer(tmp_path / "run", KillAt(3)).fit(first, WithIds(**data))
    resumed = Recorder()
    trainer(tmp_path / "run").fit(resumed, WithIds(**data), ckpt_path=tmp_path / "run" / "last.ckpt")
    assert len(first.seen) == 24 and len(resumed.seen) == 24  # 3 of the epoch's 6 batches, then the rest
    assert sorted(first.seen + resumed.seen) == list(range(48))  # the 48 training images, none twice
