"""Train and eval transforms on uint8 CHW tensors (no float work in the workers)."""

from __future__ import annotations

from typing import Literal

import torch
from torchvision.transforms import v2

AutoAugment = Literal["none", "trivialaugment", "randaugment"]


def train_transform(
    image_size: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: bool = True,
    auto_augment: AutoAugment = "none",
) -> v2.Compose:
    """RandomResizedCrop to `image_size`, optional flip and TrivialAugment/RandAugment, all on uint8."""
    steps: list[torch.nn.Module] = [
        v2.RandomResizedCrop(image_size, scale=scale, ratio=ratio, antialias=True)
    ]
    if hflip:
        steps.append(v2.RandomHorizontalFlip())
    if auto_augment == "trivialaugment":
        steps.append(v2.TrivialAugmentWide())
    elif auto_augment == "randaugment":
        steps.append(v2.RandAugment())
    return v2.Compose(steps)


def eval_transform(image_size: int, crop_ratio: float = 0.875) -> v2.Compose:
    """Resize the short side to `image_size / crop_ratio`, then centre-crop `image_size`."""
    return v2.Compose([v2.Resize(round(image_size / crop_ratio), antialias=True), v2.CenterCrop(image_size)])
