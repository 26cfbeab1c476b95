"""MixUp/CutMix (--data.mixup_alpha, --data.cutmix_alpha): soft targets on training batches only."""

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from project.data.datamodule import ImageDataModule
from project.data.transforms import BatchMix
from project.errors import UserError
from project.model import ImageClassifier
from tests.helpers import tiny_trainer


class Batches(L.Callback):
    """Keep the first training and validation batch the model receives."""

    def __init__(self) -> None:
        self.train: Any = None
        self.val: Any = None

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, i: int) -> None:
        self.train = self.train if self.train is not None else batch

    def on_validation_batch_start(
        self, trainer: L.Trainer, module: L.LightningModule, batch: Any, i: int, dl: int = 0
    ) -> None:
        self.val = self.val if self.val is not None else batch


@pytest.mark.slow
def test_training_batches_get_soft_targets_and_train(shapes_root: Path) -> None:
    torch.manual_seed(0)
    data = ImageDataModule(
        root=str(shapes_root), image_size=32, batch_size=8, num_workers=0, mixup_alpha=0.4, cutmix_alpha=1.0
    )
    model = ImageClassifier(num_classes=6, backbone="resnet18", scheduler=None, label_smoothing=0.1)
    batches = Batches()
    trainer = tiny_trainer(batches, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0)
    trainer.fit(model, data)
    images, targets = batches.train
    assert images.dtype == torch.uint8 and tuple(images.shape) == (8, 3, 32, 32)
    assert targets.dtype == torch.float32 and tuple(targets.shape) == (8, 6)
    assert torch.allclose(targets.sum(dim=1), torch.ones(8))
    assert bool(torch.isfinite(trainer.callback_metrics["train/loss"]))
    assert 0 <= float(trainer.callback_metrics["train/acc"]) <= 1
    assert batches.val[1].dtype == torch.int64  # validation sees the real images and labels


def test_zero_alphas_leave_the_batch_as_it_was(shapes_root: Path) -> None:
    data = ImageDataModule(root=str(shapes_root), image_size=32, batch_size=8, num_workers=0)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert data.batch_mix is None and data.on_after_batch_transfer(batch, 0) is batch


def test_mixup_blends_images_and_labels_by_the_same_weight() -> None:
    torch.manual_seed(1)
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 3])
    mixed, targets = BatchMix(mixup_alpha=1.0, cutmix_alpha=0.0, num_classes=5)(images, labels)
    lam = float(targets[0, 0])  # image 0 keeps lam of itself and 1 - lam of image 3 (the batch rolled by 1)
    expected = lam * images.float() + (1 - lam) * images.roll(1, 0).float()
    assert mixed.dtype == torch.uint8 and (mixed.float() - expected).abs().max() <= 0.5
    assert torch.allclose(targets[0], torch.tensor([lam, 0, 0, 1 - lam, 0]))


def test_cutmix_pastes_pixels_in_proportion_to_the_labels() -> None:
    torch.manual_seed(2)
    images = torch.stack([torch.full((3, 16, 16), v, dtype=torch.uint8) for v in (10, 20, 30, 40)])
    mixed, targets = BatchMix(mixup_alpha=0.0, cutmix_alpha=1.0, num_classes=4)(images, torch.arange(4))
    own = (mixed[1] == 20).float().mean()  # the rest of image 1 is pasted from image 0 (value 10)
    assert bool(((mixed[1] == 20) | (mixed[1] == 10)).all())
    assert torch.allclose(targets[1], torch.tensor([1 - own, own, 0, 0]), atol=1e-6)


def test_soft_one_hot_targets_give_the_hard_loss() -> None:
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=3, backbone="resnet18", label_smoothing=0.1).eval()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 0])
    hard, _ = model.loss((images, labels))
    soft, _ = model.loss((images, torch.nn.functional.one_hot(labels, 3).float()))
    assert torch.allclose(hard, soft, atol=1e-6)


@pytest.mark.parametrize("option", ["mixup_alpha", "cutmix_alpha"])
def test_negative_alpha_names_the_option(option: str) -> None:
    with pytest.raises(UserError, match=rf"--data.{option}=-0.2 is out of range: it must be a number >= 0"):
        ImageDataModule(**{option: -0.2})


# room: multilabel begin
def test_multilabel_data_refuses_mixing(tmp_path: Path) -> None:
    with pytest.raises(
        UserError, match=r"--data.mixup_alpha=0.2: MixUp, CutMix and balance are for multiclass"
    ):
        ImageDataModule(labels_csv=str(tmp_path / "labels.csv"), mixup_alpha=0.2)


# room: multilabel end
