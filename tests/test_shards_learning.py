"""A model trained from shards learns as it does from the folder they were made from: the batches mix the
classes as a shuffled folder's do, and a small split gives the folder's batches (optimize.py,
data/streaming.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.data.datamodule import ImageDataModule
from project.model import ImageClassifier
from project.optimize import main as optimize
from tests.helpers import exit_status, tiny_trainer

pytest.importorskip("litdata")

TRAIN = 300  # per class
COLOURS = {"red": (200, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 200), "grey": (128, 128, 128)}


@pytest.fixture(scope="module")
def colours(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 classes of noisy flat colours, 300 train + 10 val JPEGs each, 16 px: learnt in a few steps.

    More images per class than LitData shuffles within (a window of 256 samples): in class order, most
    batches would hold one class."""
    root = tmp_path_factory.mktemp("colours") / "images"
    rng = np.random.default_rng(0)
    for split, count in (("train", TRAIN), ("val", 10)):
        for name, rgb in COLOURS.items():
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                noisy = np.clip(np.array(rgb) + rng.normal(0, 40, (16, 16, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(noisy).save(root / split / name / f"{i:03d}.jpg", quality=95)
    return root


@pytest.fixture(scope="module")
def colour_shards(colours: Path) -> Path:
    out = colours.parent / "shards"
    assert exit_status(optimize, f"--data.root={colours}", f"--output={out}", "--workers=1") == 0
    return out


def data(root: Path, batch_size: int = 16) -> ImageDataModule:
    return ImageDataModule(
        root=str(root),
        image_size=16,
        batch_size=batch_size,
        num_workers=0,
        cache=False,  # room: cache
        scale=(0.7, 1.0),
    )


def single_class_share(root: Path) -> tuple[float, float]:
    """The share of one epoch's training batches that hold one class, and the mean classes per batch."""
    module = data(root)
    module.setup("fit")
    classes = [len(torch.unique(labels)) for _, labels in module.train_dataloader()]
    return sum(n == 1 for n in classes) / len(classes), float(np.mean(classes))


def test_training_batches_from_shards_mix_the_classes_as_the_folder_does(
    colours: Path, colour_shards: Path
) -> None:
    folder_share, folder_mean = single_class_share(colours)
    shards_share, shards_mean = single_class_share(colour_shards)
    # 4 classes in batches of 16: a shuffled order gives one class in a batch about once in 10^9 batches;
    # written in class order, LitData's shuffle (within windows of 256 samples) left most batches one class
    assert folder_share == 0 and shards_share == 0
    assert shards_mean > 3.5 and abs(shards_mean - folder_mean) < 0.25


def val_acc(root: Path) -> float:
    torch.manual_seed(0)
    module = data(root)
    model = ImageClassifier(
        num_classes=4, class_names=sorted(COLOURS), image_size=16, backbone="resnet18", channels_last=False
    )
    trainer = tiny_trainer(max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(model, module)
    return float(trainer.callback_metrics["val/acc"])


@pytest.mark.slow
def test_a_model_trained_from_shards_learns_as_from_the_folder(colours: Path, colour_shards: Path) -> None:
    from_folder, from_shards = val_acc(colours), val_acc(colour_shards)
    assert from_folder >= 0.9  # the data is easy: anything less is a broken test, not a finding
    assert from_shards >= from_folder - 0.05, (from_folder, from_shards)


def test_a_training_split_smaller_than_a_batch_gives_its_one_batch(
    colours: Path, colour_shards: Path
) -> None:
    counts = []
    for root in (colours, colour_shards):
        module = data(root, batch_size=2000)  # 1,200 training images
        module.setup("fit")
        counts.append([len(labels) for _, labels in module.train_dataloader()])
    assert counts == [[4 * TRAIN], [4 * TRAIN]]
