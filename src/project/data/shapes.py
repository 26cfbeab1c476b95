"""The embedded data set: coloured shapes on noisy backgrounds, generated into ImageFolder layout.

Deterministic: the same seed draws the same pixels on every machine (JPEG files, quality 90). It lets a bare
`python -m project fit` train with no download, and gives the tests real image files.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from project.atomic import atomic_folder

CLASSES = ("circle", "cross", "ring", "square", "star", "triangle")
SUPERSAMPLE = 2  # draw large, then downsample: smooth edges like a photographed object
IMAGE_SIZE = 64  # the drawn images' side, and the input size of a network trained from scratch by default


def generate_shapes(
    root: Path,
    train_per_class: int = 800,
    val_per_class: int = 100,
    image_size: int = IMAGE_SIZE,
    seed: int = 0,
) -> Path:
    """Write `root/{train,val}/<shape>/<n>.jpg` unless `root` exists; atomic (temp folder, rename)."""
    root = Path(root)
    if root.exists():
        return root
    with atomic_folder(root) as staging:
        for split_id, (split, count) in enumerate((("train", train_per_class), ("val", val_per_class))):
            for label, name in enumerate(CLASSES):
                folder = staging / split / name
                folder.mkdir(parents=True)
                for i in range(count):
                    rng = np.random.default_rng([seed, split_id, label, i])
                    draw_shape(name, image_size, rng).save(folder / f"{i:05d}.jpg", quality=90)
    return root


def draw_shape(name: str, size: int, rng: np.random.Generator) -> Image.Image:
    """One image of shape `name` with random position, size, rotation, colours and noise."""
    big = size * SUPERSAMPLE
    background, foreground = _contrasting_colours(rng)
    image = Image.new("RGB", (big, big), background)
    radius = big * rng.uniform(0.27, 0.37)
    margin = radius + big * 0.06  # keep the shape inside the central crop used for evaluation
    centre = rng.uniform(margin, big - margin, size=2)
    angle = rng.uniform(0, 2 * math.pi)
    draw = ImageDraw.Draw(image)
    _DRAW[name](draw, centre, radius, angle, foreground)
    image = image.resize((size, size), Image.Resampling.LANCZOS)
    noise = rng.normal(0.0, rng.uniform(3, 10), size=(size, size, 3))
    pixels = np.clip(np.asarray(image, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def _contrasting_colours(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    while True:
        background, foreground = rng.integers(0, 256, size=(2, 3))
        if np.abs(background.astype(int) - foreground).sum() > 180:
            return tuple(background.tolist()), tuple(foreground.tolist())


def _polygon(centre: np.ndarray, radii: list[float], angle: float) -> list[tuple[float, float]]:
    steps = len(radii)
    return [
        (
            centre[0] + r * math.cos(angle + 2 * math.pi * k / steps),
            centre[1] + r * math.sin(angle + 2 * math.pi * k / steps),
        )
        for k, r in enumerate(radii)
    ]


def _circle(draw: ImageDraw.ImageDraw, c: np.ndarray, r: float, angle: float, fill: tuple) -> None:
    draw.ellipse([c[0] - r, c[1] - r, c[0] + r, c[1] + r], fill=fill)


def _ring(draw: ImageDraw.ImageDraw, c: np.ndarray, r: float, angle: float, fill: tuple) -> None:
    draw.ellipse([c[0] - r, c[1] - r, c[0] + r, c[1] + r], outline=fill, width=max(1, round(r * 0.35)))


def _square(draw: ImageDraw.ImageDraw, c: np.ndarray, r: float, angle: float, fill: tuple) -> None:
    draw.polygon(_polygon(c, [r] * 4, angle), fill=fill)


def _triangle(draw: ImageDraw.ImageDraw, c: np.ndarray, r: float, angle: float, fill: tuple) -> None:
    draw.polygon(_polygon(c, [r * 1.1] * 3, angle), fill=fill)


def _star(draw: ImageDraw.ImageDraw, c: np.ndarray, r: float, angle: float, fill: tuple) -> None:
    draw.polygon(_polygon(c, [r * 1.15, r * 0.45] * 5, angle), fill=fill)


def _cross(draw: ImageDraw.ImageDraw, c: np.ndarray, r: float, angle: float, fill: tuple) -> None:
    arm, half = r * 1.05, r * 0.3
    corners = [(arm, half), (half, half), (half, arm), (-half, arm), (-half, half), (-arm, half)]
    corners += [(-x, -y) for x, y in corners]
    cos, sin = math.cos(angle), math.sin(angle)
    draw.polygon([(c[0] + x * cos - y * sin, c[1] + x * sin + y * cos) for x, y in corners], fill=fill)


_DRAW = {
    "circle": _circle,
    "cross": _cross,
    "ring": _ring,
    "square": _square,
    "star": _star,
    "triangle": _triangle,
}


def paint(
    draw: ImageDraw.ImageDraw, name: str, centre: np.ndarray, radius: float, angle: float, fill: tuple
) -> None:
    """Draw one shape `name` onto an image.
    # room: multilabel begin
    Also used by the multi-label example, data/multishapes.py.
    # room: multilabel end
    """
    _DRAW[name](draw, centre, radius, angle, fill)
