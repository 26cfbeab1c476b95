"""The Throughput callback: the epoch time and the time left it logs and shows."""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from project.callbacks import Throughput
from tests.helpers import TensorData, tiny_trainer


class Linear(L.LightningModule):
    """A linear classifier on 4 numbers: a fit of a few steps that takes milliseconds."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        return nn.functional.cross_entropy(self.net(images), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data() -> TensorData:
    return TensorData(torch.randn(32, 4), torch.randint(0, 2, (32,)), batch_size=4)  # 8 batches an epoch


@pytest.mark.slow
def test_an_epoch_resumed_midway_times_only_this_process(tmp_path: Path) -> None:
    """Lightning calls no on_train_epoch_start for the epoch a mid-epoch checkpoint resumes: timed from
    the clock's zero, `time/epoch_s` was the machine's uptime (5264.7 s)."""
    every = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1, filename="{step}")
    tiny_trainer(every, enable_checkpointing=True, limit_val_batches=0).fit(Linear(), data())
    midway = tmp_path / "step=3.ckpt"
    assert midway.is_file()

    throughput = Throughput(window=2)
    started = time.perf_counter()
    trainer = tiny_trainer(throughput, max_epochs=1, limit_val_batches=0)
    trainer.fit(Linear(), data(), ckpt_path=midway)
    took = time.perf_counter() - started
    assert trainer.global_step == 8  # resumed at step 3 of the same epoch
    assert 0 < float(trainer.callback_metrics["time/epoch_s"]) <= took


class TimeLeft(L.Callback):
    """The `eta_s` the progress bar shows after each batch."""

    def __init__(self) -> None:
        self.shown: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if "eta_s" in trainer.progress_bar_metrics:
            self.shown.append(float(trainer.progress_bar_metrics["eta_s"]))


@pytest.mark.slow
def test_the_time_left_is_at_most_the_time_budget_left() -> None:
    """With --trainer.max_time the fit ends when the budget does: `eta_s` showed 40-50 minutes with 4 left."""
    shown = TimeLeft()
    budget = 2
    trainer = tiny_trainer(
        Throughput(window=2), shown, max_epochs=100_000, limit_val_batches=0, max_time={"seconds": budget}
    )
    trainer.fit(Linear(), data())
    assert trainer.current_epoch < 100_000 - 1  # the budget ended it
    assert len(shown.shown) > 10
    assert max(shown.shown) <= budget
    assert shown.shown[-1] <= 1  # counts down with the budget
