"""What the picture callbacks share: images logged at the scalars' step, as captioned grids."""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import numpy as np
import torch
from torchvision.utils import make_grid

from project import figures
from project.callbacks.tensorboard import writer

# room: multilabel begin
from project.model import is_multilabel

# room: multilabel end


def step(trainer: L.Trainer) -> int:
    """The step Lightning logs scalars at right now, so that images and tensors line up with them."""
    # private Lightning API, checked against lightning 2.6 (the pin is <2.7)
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def add_image(trainer: L.Trainer, tag: str, image: np.ndarray) -> None:
    """Log a uint8 RGB image [H, W, 3] at the current step (rank 0, TensorBoard only)."""
    tensorboard = writer(trainer)
    if tensorboard is not None:
        tensorboard.add_image(tag, image, step(trainer), dataformats="HWC")


def captioned_grid(
    images: torch.Tensor,
    captions: Sequence[str],
    colors: Sequence[str] | None = None,
    columns: int = 6,  # 6 cells in 800 px leave each caption about 20 characters
    title: str = "",
) -> np.ndarray:
    """uint8 images [N, 3, H, W] tiled by make_grid, each with its caption above it."""
    cell = images.shape[-1]
    padding = max(2, round(cell * 0.4))  # room for the captions, in image pixels
    grid = make_grid(images.cpu(), nrow=columns, padding=padding, pad_value=255)
    return figures.image_grid(
        grid.permute(1, 2, 0).numpy(), captions, min(columns, len(images)), cell, padding, colors, title
    )


# room: multilabel begin
def single_label(pl_module: L.LightningModule) -> bool:
    """Confusion matrices and 'true -> predicted' captions need one class per image (not multi-label)."""
    return not is_multilabel(pl_module)


# room: multilabel end
