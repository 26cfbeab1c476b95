"""`python -m project show_batch`: what the model will be trained on, as a PNG, without training.

The training images come through the run's own training transform (crop, flip, auto-augment), the
validation images through its evaluation resize and crop: both uint8, exactly what the model is given
(it normalizes inside). Each image is captioned with its label.
# room: recipes begin
The training images are mixed by the run's MixUp/CutMix too, as fit mixes them.
# room: recipes end
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from project.atomic import atomic_files
from project.callbacks.pictures import captioned_grid
from project.data.datamodule import ImageDataModule
from project.errors import UserError


def batch_view(datamodule: ImageDataModule, count: int = 12, seed: int = 0) -> np.ndarray:
    """uint8 RGB [H, W, 3]: `count` augmented training images (drawn at random with `seed`) on the left,
    `count` validation images (evenly spaced) on the right, each captioned with its label."""
    # room: cache begin
    datamodule.cache = False  # a look at a few images: no decoding of the whole set into memory
    # room: cache end
    datamodule.setup("fit")
    names = datamodule.class_names
    generator = torch.Generator().manual_seed(seed)
    train, val = datamodule.datasets["train"], datamodule.datasets["val"]
    if isinstance(train, IterableDataset):
        raise UserError(
            f"show_batch looks at image files; '{datamodule.root}' holds shards (`optimize`'s output).",
            "pass the image folder the shards were made from as --data.root.",
        )
    with torch.random.fork_rng():  # the transforms draw from torch's global generator
        torch.manual_seed(seed)
        chosen = torch.randperm(len(train), generator=generator)[: count * 2].tolist()
        images, labels = _items(train, chosen, count)
        # room: recipes begin
        if datamodule.batch_mix is not None:  # MixUp/CutMix, as fit applies them on the device
            images, labels = datamodule.batch_mix(images, labels)
        # room: recipes end
    spaced = np.linspace(0, len(val) - 1, min(count, len(val))).round().astype(int).tolist()
    val_images, val_labels = _items(val, spaced, count)
    size = datamodule.image_size
    left = captioned_grid(
        images, _captions(labels, names), columns=4, title=f"training, augmented ({size} px)"
    )
    right = captioned_grid(val_images, _captions(val_labels, names), columns=4, title="validation")
    return _beside(left, right)


def write_batch_view(datamodule: ImageDataModule, output: Path, count: int = 12, seed: int = 0) -> Path:
    """The view as a PNG at `output` (written atomically); returns `output`."""
    from PIL import Image

    picture = batch_view(datamodule, count, seed)
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_files(output) as [partial]:
        Image.fromarray(picture).save(partial, format="PNG")
    return output


def _items(dataset: Dataset, indices: list[int], count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `count` (image, label) pairs of `indices`, files that cannot be read (skipped) left out."""
    images, labels = [], []
    for i in indices:
        item = dataset[i]
        if item is None:
            continue
        images.append(item[0])
        labels.append(torch.as_tensor(item[1]))
        if len(images) == count:
            break
    return torch.stack(images), torch.stack(labels)


def _captions(labels: torch.Tensor, names: list[str]) -> list[str]:
    """The class name.
    # room: recipes begin
    MixUp/CutMix: the dominant class and its share.
    # room: recipes end
    # room: multilabel begin
    Multi-label: every label.
    # room: multilabel end
    """
    # room: multilabel begin
    if labels.ndim == 2 and not labels.is_floating_point():
        return [
            " ".join(n for n, on in zip(names, row.tolist(), strict=True) if on) or "(none)" for row in labels
        ]
    # room: multilabel end
    # room: recipes begin
    if labels.ndim == 2:  # class probabilities
        shares, top = labels.max(dim=1)
        return [f"{names[int(t)]} {float(s):.0%}" for s, t in zip(shares, top, strict=True)]
    # room: recipes end
    return [names[int(y)] for y in labels]


def _beside(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Two pictures side by side on white, tops aligned."""
    height = max(left.shape[0], right.shape[0])
    gap = np.full((height, 24, 3), 255, np.uint8)

    def padded(picture: np.ndarray) -> np.ndarray:
        fill = np.full((height - picture.shape[0], picture.shape[1], 3), 255, np.uint8)
        return np.concatenate([picture, fill])

    return np.concatenate([padded(left), gap, padded(right)], axis=1)
