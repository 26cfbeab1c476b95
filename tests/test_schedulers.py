"""The learning-rate schedule fits the run: a short run warms up within it, a time budget ends annealed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from project.data.datamodule import ImageDataModule
from project.model import ImageClassifier
from project.schedulers import WarmupCosineLR
from tests.helpers import fast_args, run_cli

PEAK = 0.002  # configs/default.yaml's learning rate


def schedule(warmup_steps: int, total_steps: int | None = None) -> WarmupCosineLR:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    return WarmupCosineLR(optimizer, warmup_steps=warmup_steps, total_steps=total_steps)


def test_the_warmup_is_at_most_a_tenth_of_the_run() -> None:
    short = schedule(50)
    short.fit_run(14)  # the run's length, known once the trainer counts its batches
    assert short.get_last_lr() == [pytest.approx(1 / 2)]  # the lr of step 0 follows at once
    assert [short.factor(s) for s in (0, 1)] == [pytest.approx(1 / 2), 1.0]  # 1 step of warm-up, not 50
    assert short.factor(13) == pytest.approx(0.5 * (1 + torch.cos(torch.tensor(torch.pi * 12 / 13)).item()))
    long = schedule(50)
    long.fit_run(1000)
    assert long.factor(49) == pytest.approx(50 / 51) and long.factor(50) == 1.0


def test_a_time_budget_sets_the_length_from_the_pace() -> None:
    scheduler = schedule(0, 1000)
    shares = iter([0.125, 0.25, 0.625])  # the elapsed share of the budget at steps 8, 16 and 40
    scheduler.fit_run(None, lambda: next(shares))
    assert scheduler.length(8) == 1000  # the pace is measured from the first step seen
    assert scheduler.length(16) == 16 + 48  # 1/64 of the budget a step: 48 more steps fit
    assert scheduler.length(40) == 64
    assert "clock" not in scheduler.state_dict()


def tensorboard(run: Path) -> EventAccumulator:
    events = EventAccumulator(str(run))
    events.Reload()
    return events


@pytest.mark.slow
def test_a_run_shorter_than_the_warmup_reaches_its_lr_and_learns(workdir: Path, shapes_root: Path) -> None:
    """8 optimizer steps (16 images, batch 4, 2 epochs) with the default 50-step warm-up and model."""
    root = workdir / "two"
    for split in ("train", "val"):
        for name in ("circle", "star"):
            shutil.copytree(shapes_root / split / name, root / split / name)
    args = fast_args(
        root,
        "--name=short",
        "--data.batch_size=4",
        "--trainer.max_epochs=2",
        "--model.backbone=mobilenet_v3_small",
        "--model.scheduler.init_args.warmup_steps=50",
    )
    with pytest.warns(UserWarning, match=r"This run takes only 8 optimizer steps in all \(4 batches of 4 an "
                      r"epoch x 2 epochs\): too few to learn.*--trainer.max_epochs=25"):  # fmt: skip
        assert run_cli("fit", *args) == 0
    lrs = [e.value for e in tensorboard(workdir / "logs" / "short").Scalars("lr-AdamW/pg1")]
    assert len(lrs) == 8 and max(lrs) == pytest.approx(PEAK)  # before: 8 / 51 of it at most
    model = ImageClassifier.load_from_checkpoint(workdir / "checkpoints/short/last.ckpt").eval()
    data = ImageDataModule(root=str(root), image_size=32, batch_size=8, num_workers=0)
    data.setup("validate")
    with torch.no_grad():
        star = torch.cat([model(images).softmax(1)[:, 1] for images, _ in data.val_dataloader()])
    assert star.std() > 0.05, star  # the image decides (with the old BatchNorm start: 3e-8)


@pytest.mark.slow
def test_a_time_budget_ends_at_the_lowest_lr(workdir: Path, shapes_root: Path) -> None:
    args = fast_args(
        shapes_root, "--name=timed", "--data.batch_size=4", "--trainer.max_epochs=-1",
        "--trainer.max_time=00:00:00:08", "--model.scheduler.init_args.warmup_steps=0",
        "--trainer.limit_val_batches=1", "--data_check.enabled=false",
        # the budget goes to steps: an uneven pace makes the schedule's estimate late  # room: pictures
        "--training_images.enabled=false", "--confusion_matrix.enabled=false",  # room: pictures
        "--misclassified.enabled=false",  # room: pictures
    )  # fmt: skip
    assert run_cli("fit", *args) == 0
    lrs = [e.value for e in tensorboard(workdir / "logs" / "timed").Scalars("lr-AdamW/pg1")]
    assert len(lrs) >= 3 and lrs[0] == pytest.approx(PEAK)  # 3-6 on 2 busy cores, 30+ on a free one
    assert lrs[-1] < 0.1 * PEAK  # annealed, not cut mid-cosine (the epochs alone would leave the peak)
