"""The validation images as an export reads them, and a model's outputs over them.

`export` measures on these images what it writes into the sidecar; they are preprocessed as `infer`
does (the resize and centre crop of validation), at most MAX_IMAGES of a split, evenly spaced.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader, default_collate

from project.data.dataset import collate_skipping_none
from project.data.source import data_at_hand
from project.data.transforms import Interpolation, eval_transform

# room: unknown begin
from project.deploy.feature_bank import descriptors

# room: unknown end

MAX_IMAGES = 10_000  # evenly spaced over the split beyond this: minutes, not hours, on a CPU
# Below this many validation images the figures measured on them move by several points from one split
# to another (the standard error of an accuracy is up to 0.5 / sqrt(n): 3.5 points at 200)
FEW_IMAGES = 200


def validation_loader(
    datamodule: object,
    size: int,
    crop_ratio: float,
    batch_size: int = 64,
    interpolation: Interpolation = "bilinear",
) -> DataLoader:
    """The validation images (at most MAX_IMAGES) preprocessed as `infer` does; ValueError saying why not."""
    return split_loader(datamodule, "val", size, crop_ratio, MAX_IMAGES, batch_size, interpolation)


def split_loader(
    datamodule: object,
    split: str,
    size: int,
    crop_ratio: float,
    count: int,
    batch_size: int = 64,
    interpolation: Interpolation = "bilinear",
) -> DataLoader:
    """Up to `count` images of `split`, evenly spaced, preprocessed as `infer` does; ValueError saying why
    there are none.
    # room: cache begin

    Images the data module holds decoded (`--data.cache`) are read from memory, in this process.
    # room: cache end
    """
    source = data_at_hand(datamodule)  # image files or shards alike
    if source.count(split) == 0:
        raise ValueError(f"'{source.where}' has no {'validation' if split == 'val' else split} images")
    # --data.skip_bad_images holds here as in training: a file that does not decode is left out
    skip = bool(getattr(datamodule, "skip_bad_images", False))
    dataset = source.samples(split, count, eval_transform(size, crop_ratio, interpolation), skip)
    workers = int(getattr(datamodule, "num_workers", 0) or 0)
    # room: cache begin
    # decoded at setup by --data.cache (the export at the end of fit): read there, no workers to start
    if (getattr(datamodule, "decoded", None) or {}).get(split) is not None:
        workers = 0
    # room: cache end
    collate = collate_skipping_none if skip else default_collate
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate)


def good_batches(loader: DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The (images, targets) batches of `loader`, less those whose every image was skipped as bad."""
    return (batch for batch in loader if batch is not None)


def outputs_of(
    model: nn.Module, images: torch.Tensor, features: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits [N, C], features or None) of `model` on uint8 `images`: a Deployable's penultimate
    features [N, D] where `features` asks (none for a model that outputs logits alone).

    # room: unknown begin
    The features come beside the images' statistics (`feature_bank.descriptors`), [N, D + 72]: what the
    knn score compares.
    # room: unknown end
    """
    out = model(images)
    logits, kept = out if isinstance(out, tuple) else (out, None)
    if kept is None or not features:
        return logits.float(), None
    kept = torch.from_numpy(descriptors(kept.float().numpy(), images.numpy()))  # room: unknown
    return logits.float(), kept


class Collected(NamedTuple):
    """A model's outputs over a loader: logits [N, C] float32, features (as `outputs_of` gives them) or
    None, labels [N]."""

    logits: torch.Tensor
    features: torch.Tensor | None
    labels: torch.Tensor


@torch.no_grad()
def collect(model: nn.Module, loader: DataLoader, features: bool = False) -> Collected:
    """The outputs of `model` (uint8 images in) over `loader`, with the features where `features` asks."""
    logits, kept, labels = [], [], []
    for images, targets in good_batches(loader):
        batch_logits, batch_features = outputs_of(model, images, features)
        logits.append(batch_logits)
        kept.append(batch_features)
        labels.append(targets.long())
    if not logits:
        return Collected(torch.empty(0, 0), None, torch.empty(0, dtype=torch.long))
    return Collected(torch.cat(logits), None if kept[0] is None else torch.cat(kept), torch.cat(labels))


def collect_logits(model: nn.Module, loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [N, C] float32, labels [N]) of `model` (uint8 images in) over `loader`."""
    logits, _, labels = collect(model, loader)
    return logits, labels
