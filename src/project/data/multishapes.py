"""The embedded multi-label example: one to three different shapes per image, listed in a labels CSV.

Each shape sits in its own quarter of the image, so none hides another. Writes
`root/{train,val}/<n>.jpg` and `root/labels.csv` (`file,labels,split`, labels separated by spaces);
deterministic for a seed, and atomic like the shapes data set (temporary folder, then rename).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from project.atomic import atomic_folder
from project.data.shapes import CLASSES, SUPERSAMPLE, paint

CELLS = ((0, 0), (1, 0), (0, 1), (1, 1))  # quarters of the image, as (column, row)


def generate_multishapes(
    root: Path, train: int = 4000, val: int = 400, image_size: int = 64, seed: int = 0
) -> Path:
    """Write the images and `root/labels.csv` unless `root` exists; return `root`."""
    root = Path(root)
    if root.exists():
        return root
    with atomic_folder(root) as staging:
        rows = []
        for split_id, (split, count) in enumerate((("train", train), ("val", val))):
            (staging / split).mkdir()
            for i in range(count):
                rng = np.random.default_rng([seed, split_id, i])
                image, names = draw_shapes(image_size, rng)
                file = f"{split}/{i:05d}.jpg"
                image.save(staging / file, quality=90)
                rows.append((file, " ".join(names), split))
        with open(staging / "labels.csv", "w", newline="") as f:
            csv.writer(f).writerows([("file", "labels", "split"), *rows])
    return root


def draw_shapes(size: int, rng: np.random.Generator) -> tuple[Image.Image, list[str]]:
    """An image with 1-3 different shapes in different quarters, and their names (sorted)."""
    names = sorted(rng.choice(CLASSES, size=rng.integers(1, 4), replace=False).tolist())
    cells = rng.permutation(len(CELLS))[: len(names)]
    big = size * SUPERSAMPLE
    background = rng.integers(0, 256, size=3)
    image = Image.new("RGB", (big, big), tuple(background.tolist()))
    draw = ImageDraw.Draw(image)
    half = big / 2
    for name, cell in zip(names, cells, strict=True):
        radius = half * rng.uniform(0.25, 0.32)
        # a clear gap to the neighbouring quarters, and to the image border a wider one: the
        # evaluation's centre crop (crop_ratio 0.875) cuts 6.25% off each side
        inner, outer = radius * 1.15 + half * 0.02, radius * 1.15 + half * 0.13
        low = [outer if c == 0 else half + inner for c in CELLS[cell]]
        high = [half - inner if c == 0 else big - outer for c in CELLS[cell]]
        centre = rng.uniform(low, high)
        paint(draw, name, centre, radius, rng.uniform(0, 2 * np.pi), _contrasting(background, rng))
    image = image.resize((size, size), Image.Resampling.LANCZOS)
    noise = rng.normal(0.0, rng.uniform(3, 8), size=(size, size, 3))
    pixels = np.clip(np.asarray(image, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels), names


def _contrasting(background: np.ndarray, rng: np.random.Generator) -> tuple[int, ...]:
    while True:
        colour = rng.integers(0, 256, size=3)
        if np.abs(colour.astype(int) - background).sum() > 180:
            return tuple(colour.tolist())
