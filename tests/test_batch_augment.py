"""Batch augmentation (data/batch_augment.py) against torchvision's per-image transforms."""

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from project.data.batch_augment import BatchAugment, CachedBatches, apply, resize, resize_weights
from project.data.datamodule import ImageDataModule
from project.data.dataset import ImageDataset
from project.data.transforms import MODES, train_transform
from tests.helpers import write_image

SPACE = v2.TrivialAugmentWide._AUGMENTATION_SPACE


def sample_images() -> torch.Tensor:
    """32 noisy and 32 smooth 32x32 images (smooth ones have ties and flat areas, noise has extremes)."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, generator=generator)
    images[32:] = F.gaussian_blur(images[32:], 7)
    return images


def per_image(name: str, images: torch.Tensor, magnitudes: torch.Tensor) -> torch.Tensor:
    """What v2's auto-augment does to each image with its magnitude."""
    trivial = v2.TrivialAugmentWide()
    return torch.stack(
        [
            trivial._apply_image_or_video_transform(image, name, float(m), interpolation="nearest", fill={})
            for image, m in zip(images, magnitudes, strict=True)
        ]
    )


@pytest.mark.parametrize("name", [name for name in SPACE if name != "Identity"])
def test_each_operation_matches_torchvision_per_image(name: str) -> None:
    images = sample_images()
    magnitudes_fn, signed = SPACE[name]
    table = magnitudes_fn(31, 32, 32)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):  # every bin and sign comes up over 192 draws
        magnitude = torch.zeros(64, dtype=torch.float64)
        if table is not None:
            magnitude = table[torch.randint(31, (64,), generator=generator)].double()
        if signed:
            magnitude = torch.where(torch.rand(64, generator=generator) < 0.5, -magnitude, magnitude)
        difference = (apply(name, images, magnitude).int() - per_image(name, images, magnitude).int()).abs()
        # colour blends round once more or less than v2 on a few pixels; the rest is exact
        assert difference.max() <= (1 if name == "Color" else 0), name
        assert (difference > 0).float().mean() < 0.002


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("source", [(32, 32), (96, 80)])
def test_crops_resize_like_resized_crop_and_flip_like_v2(source: tuple[int, int], interpolation: str) -> None:
    """Enlarged (CIFAR: every crop is at most 32 px) and shrunk (antialiased) crops, then flips."""
    images = sample_images()[:16]
    if source != (32, 32):
        images = F.resize(images, list(source), antialias=True)
    height, width = source
    torch.manual_seed(2)
    augment = BatchAugment(24, scale=(0.08, 1.0))
    top, left, h, w = augment.crops(16, height, width)
    rows = resize_weights(top, h, height, 24, interpolation)
    columns = resize_weights(left, w, width, 24, interpolation)
    ours = resize(images, rows, columns, interpolation)
    mode = MODES[interpolation]
    reference = torch.stack(
        [
            F.resized_crop(image, int(y), int(x), int(hh), int(ww), [24, 24], mode, antialias=True)
            for image, y, x, hh, ww in zip(images, top, left, h, w, strict=True)
        ]
    )
    # torch's uint8 resize computes in fixed point: within one grey level of the float result
    assert (ours.int() - reference.int()).abs().max() <= 1
    flipped = columns.flip(1)  # how __call__ flips an image: its column weights reversed
    assert torch.equal(resize(images, rows, flipped, interpolation), F.horizontal_flip(ours))


def total_variation(a: np.ndarray, b: np.ndarray, bins: np.ndarray) -> float:
    """Half the L1 distance of the two samples' histograms over `bins`."""
    pa, pb = np.histogram(a, bins)[0] / len(a), np.histogram(b, bins)[0] / len(b)
    return 0.5 * float(np.abs(pa - pb).sum())


def crop_samples(scale: tuple[float, float], height: int, width: int, n: int = 20000) -> np.ndarray:
    """[n, 4] (top, left, height, width) drawn by v2.RandomResizedCrop one crop at a time."""
    crop = v2.RandomResizedCrop(24, scale=scale)
    image = torch.zeros(3, height, width, dtype=torch.uint8)
    make_params = getattr(crop, "make_params", None) or crop._get_params  # torchvision < 0.21
    params = [make_params([image]) for _ in range(n)]
    return np.array([[p["top"], p["left"], p["height"], p["width"]] for p in params])


@pytest.mark.parametrize(("scale", "source"), [((0.35, 1.0), (32, 32)), ((0.08, 1.0), (40, 12))])
def test_crops_have_the_distribution_of_random_resized_crop(
    scale: tuple[float, float], source: tuple[int, int]
) -> None:
    """Offsets, sizes and the joint (height, width) histogram: as v2 draws them, within sampling noise.

    (40, 12) is tall and narrow: many draws fall back to the centre crop, as in v2.
    """
    torch.manual_seed(3)
    reference = crop_samples(scale, *source)
    ours = np.stack([t.numpy() for t in BatchAugment(24, scale=scale).crops(20000, *source)], 1)
    wrong = np.stack([t.numpy() for t in BatchAugment(24, scale=(0.7, 1.0)).crops(20000, *source)], 1)
    bins = np.arange(max(source) + 2) - 0.5
    height, width = source
    joint = reference[:, 2] * (width + 1) + reference[:, 3]
    joint_bins = np.arange((height + 1) * (width + 1) + 1) - 0.5
    for column in range(4):
        assert total_variation(ours[:, column], reference[:, column], bins) < 0.04, column
    assert total_variation(ours[:, 2] * (width + 1) + ours[:, 3], joint, joint_bins) < 0.08
    # the test can fail: another scale range is far off
    assert total_variation(wrong[:, 2] * (width + 1) + wrong[:, 3], joint, joint_bins) > 0.3


@pytest.mark.parametrize("auto_augment", ["trivialaugment", "randaugment"])
def test_whole_pipeline_has_the_distribution_of_the_per_image_transforms(auto_augment: str) -> None:
    """One image through each pipeline 3000 times: the brightness and contrast of the results agree.

    Covers the choice of operation, its magnitude bin and sign, the crop and the flip together.
    """
    image = sample_images()[40]
    options = dict(scale=(0.35, 1.0), hflip=True, auto_augment=auto_augment)
    torch.manual_seed(4)
    reference = torch.stack([train_transform(32, **options)(image) for _ in range(3000)]).float()
    ours = BatchAugment(32, **options)(image.expand(3000, -1, -1, -1).contiguous()).float()
    plain = BatchAugment(32, scale=(0.35, 1.0))(image.expand(3000, -1, -1, -1).contiguous()).float()
    for statistic, bins in (
        (lambda x: x.mean((1, 2, 3)), np.linspace(0, 255, 26)),
        (lambda x: x.std((1, 2, 3)), np.linspace(0, 128, 26)),
    ):
        expected = statistic(reference).numpy()
        assert total_variation(statistic(ours).numpy(), expected, bins) < 0.08
        assert total_variation(statistic(plain).numpy(), expected, bins) > 0.2  # no auto-augment: far off


def test_cached_training_split_is_augmented_a_batch_at_a_time(shapes_root: Path) -> None:
    dm = ImageDataModule(root=str(shapes_root), image_size=24, num_workers=0, cache=True, batch_size=16)
    dm.setup("fit")
    train = dm.datasets["train"]
    assert isinstance(train, CachedBatches) and isinstance(dm.datasets["val"], ImageDataset)
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (16, 3, 24, 24) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    epoch = list(dm.train_dataloader())
    assert sum(len(labels) for _, labels in epoch) == 48  # three whole batches, every image once
    # each index brings its own image and label
    same = BatchAugment(32, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=False)
    exact = CachedBatches(dm.splits["train"], dm.decoded["train"], same)
    picked, picked_labels = exact.__getitems__([7, 0, 30])
    for image, label, i in zip(picked, picked_labels, [7, 0, 30], strict=True):
        assert torch.equal(image, dm.decoded["train"].image(i)) and label == dm.splits["train"].labels[i]
    off = ImageDataModule(root=str(shapes_root), num_workers=0, cache=True, batch_augment=False)
    off.setup("fit")
    assert isinstance(off.datasets["train"], ImageDataset)


def test_half_the_images_are_flipped_each_on_its_own() -> None:
    image = sample_images()[0]  # noise: no image equals its mirror
    batch = image.expand(400, -1, -1, -1).contiguous()
    whole = dict(scale=(1.0, 1.0), ratio=(1.0, 1.0))  # the crop is the image: only the flip acts
    torch.manual_seed(5)
    out = BatchAugment(32, **whole)(batch)
    same = (out == image).flatten(1).all(1)
    mirrored = (out == F.horizontal_flip(image)).flatten(1).all(1)
    assert bool((same ^ mirrored).all())  # each output is the image or its mirror, exactly
    assert 160 < int(mirrored.sum()) < 240  # p = 0.5: 200 +- 20 (two standard deviations)
    assert bool((BatchAugment(32, **whole, hflip=False)(batch) == image).all())


@pytest.mark.parametrize("auto_augment", ["none", "trivialaugment", "randaugment"])
def test_the_augmentation_pickles_for_spawned_workers(auto_augment: str) -> None:
    """Spawned loader workers (macOS, Windows, Python 3.14's forkserver) receive it pickled."""
    augment = pickle.loads(pickle.dumps(BatchAugment(24, auto_augment=auto_augment)))
    assert augment(sample_images()[:4]).shape == (4, 3, 24, 24)


def test_images_larger_than_the_small_image_limit_are_augmented_one_at_a_time(tmp_path: Path) -> None:
    """Past 128x128 the resize matrices (which span the whole image) cost more than per-image crops."""
    for i in range(4):
        for split in ("train", "val"):
            write_image(tmp_path / split / ("a" if i % 2 else "b") / f"{i}.png", size=(160, 120))
    dm = ImageDataModule(root=str(tmp_path), image_size=16, num_workers=0, cache=True, batch_size=2)
    dm.setup("fit")
    assert isinstance(dm.datasets["train"], ImageDataset)


def test_images_of_several_sizes_are_augmented_one_at_a_time(tmp_path: Path) -> None:
    for i, size in enumerate([(20, 12), (32, 32), (40, 40), (32, 32)]):
        write_image(tmp_path / "train" / ("a" if i % 2 else "b") / f"{i}.png", size=size)
        write_image(tmp_path / "val" / ("a" if i % 2 else "b") / f"{i}.png", size=size)
    dm = ImageDataModule(root=str(tmp_path), image_size=16, num_workers=0, cache=True, batch_size=2)
    dm.setup("fit")
    assert isinstance(dm.datasets["train"], ImageDataset)
    assert next(iter(dm.train_dataloader()))[0].shape == (2, 3, 16, 16)


# room: multilabel begin
def test_multilabel_rows_come_with_their_images(tmp_path: Path) -> None:
    rows = ["file,labels"]
    for i in range(8):
        write_image(tmp_path / f"{i}.png", size=(16, 16))
        rows.append(f"{i}.png,{'cat' if i % 2 else 'dog'}{' sun' if i < 4 else ''}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    dm = ImageDataModule(
        labels_csv=str(tmp_path / "labels.csv"), val_split=0.25, image_size=16, num_workers=0, cache=True
    )
    dm.setup("fit")
    train = dm.datasets["train"]
    assert isinstance(train, CachedBatches)
    images, labels = train.__getitems__([0, 1, 2])
    assert images.shape == (3, 3, 16, 16)
    assert torch.equal(labels, torch.from_numpy(dm.splits["train"].labels[[0, 1, 2]]))


# room: multilabel end
