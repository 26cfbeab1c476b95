from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.data.decode import BadImageError, load_rgb
from tests.conftest import write_image


@pytest.mark.parametrize(
    ("mode", "suffix"),
    [
        ("L", "png"),
        ("P", "png"),
        ("RGBA", "png"),
        ("LA", "png"),
        ("CMYK", "jpg"),
        ("I;16", "png"),
        ("RGB", "jpg"),
        ("L", "jpg"),
        ("RGB", "bmp"),
        ("RGB", "webp"),
        ("RGB", "tiff"),
        ("1", "png"),
    ],
)
def test_every_colour_mode_becomes_3_channel_uint8(tmp_path: Path, mode: str, suffix: str) -> None:
    path = write_image(tmp_path / f"img.{suffix}", mode, size=(20, 12))
    image = load_rgb(path)
    assert image.dtype == torch.uint8
    assert tuple(image.shape) == (3, 12, 20)


def test_16_bit_values_are_scaled_not_clipped(tmp_path: Path) -> None:
    path = tmp_path / "deep.png"
    Image.fromarray(np.full((4, 4), 32768, dtype=np.uint16)).save(path)
    assert load_rgb(path).unique().tolist() == [128]


def test_palette_with_transparency(tmp_path: Path) -> None:
    img = Image.new("P", (8, 8), 3)
    img.info["transparency"] = 0
    img.save(tmp_path / "pal.png", transparency=0)
    assert load_rgb(tmp_path / "pal.png").shape == (3, 8, 8)


@pytest.mark.parametrize("suffix", ["jpg", "png"])
def test_exif_orientation_is_honoured(tmp_path: Path, suffix: str) -> None:
    img = Image.new("RGB", (30, 10), (255, 0, 0))
    exif = img.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    img.save(tmp_path / f"rot.{suffix}", exif=exif)
    assert tuple(load_rgb(tmp_path / f"rot.{suffix}").shape) == (3, 30, 10)


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"", "empty"), (b"\xff\xd8\xff\xe0 truncated", ""), (b"random bytes, not an image", "")],
)
def test_bad_file_names_the_file(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "broken.jpg"
    path.write_bytes(content)
    with pytest.raises(
        BadImageError, match=rf"Cannot decode image '.*broken.jpg'.*{reason}.*skip_bad_images"
    ):
        load_rgb(path)
