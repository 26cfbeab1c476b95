"""Read an image file of any common format into a 3-channel uint8 CHW tensor, upright per EXIF."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torchvision.io import ImageReadMode, decode_jpeg

from project.errors import UserError

JPEG_MAGIC = b"\xff\xd8\xff"
# JPEG start-of-frame markers (baseline, progressive, lossless, ...): they carry the image size
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class BadImageError(UserError):
    """An image file that cannot be decoded; `reason` says why, for the list of skipped files."""

    reason = ""


def bad_image(path: Path, reason: str) -> BadImageError:
    error = BadImageError(
        f"Cannot decode image '{path}': {reason}.",
        "delete or replace the file, or set --data.skip_bad_images=true to skip such files with a warning.",
    )
    error.reason = reason
    return error


def load_rgb(path: Path) -> torch.Tensor:
    """Decode `path` to uint8 [3, H, W] RGB; raises BadImageError naming the file when it cannot."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe or device would block or never end
            raise bad_image(path, "not a regular file")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise bad_image(path, e.strerror or type(e).__name__) from None
    if not data:
        raise bad_image(path, "the file is empty")
    if data.startswith(JPEG_MAGIC):
        _check_pixel_count(path, _jpeg_size(data))
        try:  # libjpeg-turbo through torchvision: faster than PIL for the common case
            buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            return decode_jpeg(buffer, mode=ImageReadMode.RGB, apply_exif_orientation=True)
        except RuntimeError:
            pass  # unusual JPEGs (e.g. some CMYK/progressive variants): let PIL try
    return _load_with_pil(path)


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's start-of-frame header, without decoding; None if not found."""
    i = 2
    while i + 9 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker in _JPEG_SOF:
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
    return None


def _check_pixel_count(path: Path, size: tuple[int, int] | None) -> None:
    """The decompression-bomb rule Pillow applies to other formats, for the libjpeg fast path too."""
    if size is None or Image.MAX_IMAGE_PIXELS is None:
        return
    limit = 2 * Image.MAX_IMAGE_PIXELS
    if size[0] * size[1] > limit:
        raise bad_image(
            path,
            f"its header claims {size[0]}x{size[1]} = {size[0] * size[1]} pixels, more than the limit of "
            f"{limit} (2 x PIL.Image.MAX_IMAGE_PIXELS): a possible decompression bomb",
        )


def _load_with_pil(path: Path) -> torch.Tensor:
    try:
        with Image.open(path) as img:
            img.seek(0)  # first frame of animations
            img = ImageOps.exif_transpose(img)
            array = _to_rgb_array(img)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, EOFError) as e:
        raise bad_image(path, str(e) or type(e).__name__) from None
    return torch.from_numpy(np.array(array.transpose(2, 0, 1), order="C"))  # a writable copy


def _to_rgb_array(img: Image.Image) -> np.ndarray:
    """HWC uint8 RGB from any PIL mode: 16/32-bit integer images are scaled, not clipped."""
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        values = np.asarray(img, dtype=np.int64)
        gray = (values >> 8) if img.mode != "I" or values.max() > 255 else values
        return np.repeat(np.clip(gray, 0, 255).astype(np.uint8)[..., None], 3, axis=2)
    if img.mode == "F":
        gray = np.asarray(img, dtype=np.float32)
        gray = gray * 255.0 if gray.max() <= 1.0 else gray
        return np.repeat(np.clip(gray, 0, 255).astype(np.uint8)[..., None], 3, axis=2)
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    return np.asarray(img.convert("RGB"), dtype=np.uint8)
