"""Train and eval transforms on uint8 CHW tensors (no float work in the workers)."""

from __future__ import annotations

from typing import Literal

import torch
from torchvision.transforms import InterpolationMode, v2

AutoAugment = Literal["none", "trivialaugment", "randaugment"]
Balance = Literal["none", "sampler", "loss"]  # --data.balance  # room: recipes
Cache = bool | Literal["auto"]  # --data.cache  # room: cache
# The resize filters: bilinear (torchvision's weights) and bicubic (most timm weights); always antialiased,
# as Pillow resizes in `infer` and `serve` (project.deploy.classifier), so that they agree.
Interpolation = Literal["bilinear", "bicubic"]
MODES = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}


def train_transform(
    image_size: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: bool = True,
    auto_augment: AutoAugment = "none",
    interpolation: Interpolation = "bilinear",
) -> v2.Compose:
    """RandomResizedCrop to `image_size` (resized with `interpolation`), optional flip and
    TrivialAugment/RandAugment, all on uint8.
    # room: cache begin

    Cached training images of one size get the batched equivalent, data/batch_augment.py's
    `BatchAugment`: a change here needs the same change there (or --data.batch_augment=false).
    # room: cache end
    """
    steps: list[torch.nn.Module] = [
        v2.RandomResizedCrop(
            image_size, scale=scale, ratio=ratio, interpolation=MODES[interpolation], antialias=True
        )
    ]
    if hflip:
        steps.append(v2.RandomHorizontalFlip())
    if auto_augment == "trivialaugment":
        steps.append(v2.TrivialAugmentWide())
    elif auto_augment == "randaugment":
        steps.append(v2.RandAugment())
    return v2.Compose(steps)


def eval_transform(
    image_size: int, crop_ratio: float = 0.875, interpolation: Interpolation = "bilinear"
) -> v2.Compose:
    """Resize the short side to `image_size / crop_ratio` (with `interpolation`), then centre-crop
    `image_size`."""
    resize = v2.Resize(round(image_size / crop_ratio), interpolation=MODES[interpolation], antialias=True)
    return v2.Compose([resize, v2.CenterCrop(image_size)])


# room: recipes begin
class BatchMix(torch.nn.Module):
    """MixUp and/or CutMix of a training batch (one of the two, at random, per batch when both are on).

    uint8 images [N, 3, H, W] and class indices [N] in; uint8 images and class probabilities [N, C]
    (soft targets that sum to 1) out. Mixing happens in float and is rounded back to uint8, so the
    model, its normalization and the monitoring callbacks see the usual uint8 batch.
    """

    def __init__(self, mixup_alpha: float, cutmix_alpha: float, num_classes: int) -> None:
        """
        Args:
            mixup_alpha: MixUp's Beta(alpha, alpha) for the mixing weight; 0 turns MixUp off.
            cutmix_alpha: CutMix's Beta(alpha, alpha) for the pasted area; 0 turns CutMix off.
            num_classes: Number of classes of the soft targets.
        """
        super().__init__()
        steps: list[torch.nn.Module] = []
        if mixup_alpha > 0:
            steps.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
        if cutmix_alpha > 0:
            steps.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
        self.mix = steps[0] if len(steps) == 1 else v2.RandomChoice(steps)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mixed, targets = self.mix(images.float(), labels)
        return mixed.round_().clamp_(0, 255).to(images.dtype), targets


# room: recipes end
