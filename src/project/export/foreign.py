"""Images that belong to no class, made here without any download: what `export` measures the unknown
scores against, to choose the one that answers them `unknown` (`project.export.fit_calibration`).

Each kind stands for a way a deployed classifier meets what it was not trained on:

- `noise`: uniform random pixels (a broken sensor, a decoding error);
- `flat`: one colour, black and white among them (a covered lens, a blank frame);
- `smooth`: low-frequency colour noise (an out-of-focus scene, a wall, the sky);
- `shuffled`: validation images cut into 4 x 4 tiles put back in a random order (the colours and
  textures of the data, none of its objects);
- `shapes`: drawn shapes on noisy backgrounds (the embedded data set), for a model whose classes are
  not those shapes.

They are made at the export's input size, already preprocessed (uint8 [3, S, S]), with a fixed seed:
the same images for every export of a model. Real photos of other things are the harder test; the
benchmark (`bench/unknown.py`) measures those.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from project.data.shapes import CLASSES, draw_shape

PER_KIND = 16
TILES = 4
SEED = 0


def foreign_images(
    size: int, validation: Sequence[torch.Tensor], class_names: Sequence[str]
) -> dict[str, torch.Tensor]:
    """Each kind's images, uint8 [PER_KIND, 3, size, size], by name (`shuffled` only given validation
    images, `shapes` only for a model of other classes)."""
    rng = np.random.default_rng(SEED)
    kinds = {
        "noise": rng.integers(0, 256, (PER_KIND, 3, size, size), dtype=np.uint8),
        "flat": _flat(rng, size),
        "smooth": _smooth(rng, size),
    }
    if len(validation):
        kinds["shuffled"] = _shuffled(rng, validation)
    if not set(class_names) & set(CLASSES):
        drawn = [draw_shape(CLASSES[i % len(CLASSES)], size, rng) for i in range(PER_KIND)]
        kinds["shapes"] = np.stack([np.asarray(d).transpose(2, 0, 1) for d in drawn])
    return {name: torch.from_numpy(np.ascontiguousarray(images)) for name, images in kinds.items()}


def _flat(rng: np.random.Generator, size: int) -> np.ndarray:
    colours = np.concatenate(
        [[[0, 0, 0], [255, 255, 255], [128, 128, 128]], rng.integers(0, 256, (PER_KIND - 3, 3))]
    )
    return np.broadcast_to(colours[:, :, None, None], (PER_KIND, 3, size, size)).astype(np.uint8)


def _smooth(rng: np.random.Generator, size: int) -> np.ndarray:
    """Colour noise on a 4 x 4 grid, resized up bilinearly: gentle gradients and blotches."""
    coarse = torch.from_numpy(rng.uniform(0, 255, (PER_KIND, 3, 4, 4)).astype(np.float32))
    smooth = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    return smooth.round().clamp(0, 255).to(torch.uint8).numpy()


def _shuffled(rng: np.random.Generator, validation: Sequence[torch.Tensor]) -> np.ndarray:
    """Validation images (preprocessed, [3, S, S]) with their TILES x TILES tiles in a random order."""
    images = []
    for i in range(PER_KIND):
        image = np.asarray(validation[i % len(validation)])
        size = image.shape[-1]
        step = size // TILES
        tiles = [
            image[:, r * step : (r + 1) * step, c * step : (c + 1) * step]
            for r in range(TILES)
            for c in range(TILES)
        ]
        order = rng.permutation(len(tiles))
        rows = [
            np.concatenate([tiles[j] for j in order[r * TILES : (r + 1) * TILES]], axis=2)
            for r in range(TILES)
        ]
        out = image.copy()  # a size not divisible by TILES keeps its last pixels in place
        out[:, : TILES * step, : TILES * step] = np.concatenate(rows, axis=1)
        images.append(out)
    return np.stack(images)
