"""The one decoding rule of every command: an image file's bytes to uint8 RGB, upright per EXIF.

`decode_rgb` serves training, evaluation, `predict`, `infer` and `serve`, so a file means the same
pixels everywhere: the same formats, the same 16-bit scaling, palette and alpha handling, EXIF
rotation, first frame of animations, and the same refusals (pixel count, aspect ratio). This
module imports no torch: `load_rgb`, training's entry, imports it when called. Training decodes
JPEG pixels with torchvision's libjpeg-turbo (about twice as fast as Pillow on small files);
tests/test_decode.py checks that it gives Pillow's pixels exactly (docs/consistency.md).
"""

from __future__ import annotations

import io
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageOps

from project.errors import UserError

if TYPE_CHECKING:
    import torch

FORMATS = ("JPEG", "PNG", "BMP", "GIF", "TIFF", "WEBP", "PPM")  # the formats of IMAGE_EXTENSIONS
JPEG_MAGIC = b"\xff\xd8\xff"
# JPEG start-of-frame markers (baseline, progressive, lossless, ...): they carry the image size
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Resizing the short side to the model's input lets the long side grow with the aspect ratio: a
# 2 KB PNG of 1x1,000,000 pixels became a 7 GB resize. Photos, panoramas and web banners stay far below.
MAX_ASPECT_RATIO = 100
# A file is read whole before its header is checked: a 4 GB file in an image folder was read into
# memory (in each loader worker) first. No image worth decoding is larger than an uncompressed 8-bit
# RGBA one at Pillow's pixel limit (2 x 89.5 M pixels x 4 bytes = 716 MB): larger files are refused unread.
MAX_FILE_BYTES = 1 << 30

JpegDecoder = Callable[[bytes], np.ndarray]  # JPEG bytes -> uint8 [H, W, 3] upright; raises when it cannot


class BadImageError(UserError):
    """An image file that cannot be used; `reason` says why, `kind` what kind of refusal it is.

    kind: "unreadable" (the file system), "empty", "format" (not an image in FORMATS), "size" (too
    many pixels), "shape" (aspect ratio beyond MAX_ASPECT_RATIO) or "corrupt".
    """

    reason = ""
    kind = "corrupt"


def bad_image(name: str | Path, reason: str, kind: str = "corrupt") -> BadImageError:
    error = BadImageError(
        f"Cannot decode image '{name}': {reason}.",
        "delete or replace the file, or set --data.skip_bad_images=true to skip such files with a warning.",
    )
    error.reason, error.kind = reason, kind
    return error


def read_file(path: Path) -> bytes:
    """The bytes of an image file; BadImageError for a missing, unreadable or special file."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):  # a pipe or device would block or never end
            raise bad_image(path, "not a regular file", "unreadable")
        if info.st_size > MAX_FILE_BYTES:
            raise _too_large(path, info.st_size)
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # bounded also when the file grows while it is read
    except OSError as e:
        raise bad_image(path, e.strerror or type(e).__name__, "unreadable") from None
    if len(data) > MAX_FILE_BYTES:
        raise _too_large(path, len(data))
    return data


def _too_large(path: Path, size: int) -> BadImageError:
    reason = f"it is {size:,} bytes, more than the limit of {MAX_FILE_BYTES:,} bytes for one image file"
    return bad_image(path, reason, "size")


def read_rgb(path: Path) -> np.ndarray:
    """uint8 [H, W, 3] of an image file, decoded by Pillow: the torch-free commands' entry."""
    return decode_rgb(read_file(path), path)


def load_rgb(path: Path) -> torch.Tensor:
    """uint8 [3, H, W] of an image file, JPEGs through libjpeg-turbo: training's entry."""
    import torch  # here, not at the top: infer and serve import this module without torch

    chw = decode_rgb(read_file(path), path, jpeg=_libjpeg_turbo).transpose(2, 0, 1)
    chw = np.ascontiguousarray(chw)  # no copy when libjpeg-turbo wrote CHW already
    return torch.from_numpy(chw if chw.flags.writeable else chw.copy())


def decode_rgb(
    data: bytes, name: str | Path, max_pixels: int | None = None, jpeg: JpegDecoder | None = None
) -> np.ndarray:
    """uint8 [H, W, 3] RGB of an image file's bytes, upright; BadImageError naming `name` if refused.

    `max_pixels` defaults to Pillow's decompression-bomb limit (2 x Image.MAX_IMAGE_PIXELS); both
    it and MAX_ASPECT_RATIO are checked from the header, before any pixel is decoded. `jpeg`
    decodes JPEG pixels instead of Pillow (it must give Pillow's pixels); Pillow takes over for
    the JPEGs it refuses.
    """
    return decode_image(data, name, max_pixels, jpeg)[0]


def decode_image(
    data: bytes, name: str | Path, max_pixels: int | None = None, jpeg: JpegDecoder | None = None
) -> tuple[np.ndarray, str]:
    """(`decode_rgb`'s pixels, the format's name in FORMATS)."""
    if not data:
        raise bad_image(name, "the file is empty", "empty")
    limit = max_pixels if max_pixels is not None else _pillow_limit()
    size = _jpeg_size(data) if data.startswith(JPEG_MAGIC) else None
    if size is not None:  # checked here too: the libjpeg path never asks Pillow
        _check_header(name, size, limit)
        if jpeg is not None:
            try:
                return jpeg(data), "JPEG"
            except (RuntimeError, ValueError):
                pass  # unusual JPEGs (some CMYK or lossless variants): Pillow decides
    return _decode_with_pil(data, name, limit)


def _pillow_limit() -> int | None:
    return None if Image.MAX_IMAGE_PIXELS is None else 2 * Image.MAX_IMAGE_PIXELS


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


def _check_header(name: str | Path, size: tuple[int, int], max_pixels: int | None) -> None:
    """Refuse, before decoding, more pixels than `max_pixels` or an aspect ratio beyond the limit."""
    width, height = size
    if max_pixels is not None and width * height > max_pixels:
        raise bad_image(
            name,
            f"its header claims {width}x{height} = {width * height} pixels, more than the limit of "
            f"{max_pixels}: a possible decompression bomb",
            "size",
        )
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise bad_image(
            name,
            f"it is {width}x{height} pixels, an aspect ratio beyond the limit of {MAX_ASPECT_RATIO}:1 "
            "(resizing its short side to the model's input would make the long side huge); crop it",
            "shape",
        )


def _decode_with_pil(data: bytes, name: str | Path, max_pixels: int | None) -> tuple[np.ndarray, str]:
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as img:  # reads the header only
            _check_header(name, img.size, max_pixels)
            img.seek(0)  # first frame of animations
            return _to_rgb_array(ImageOps.exif_transpose(img)), str(img.format)
    except Image.UnidentifiedImageError:
        reason = f"cannot identify an image in a format training reads ({', '.join(FORMATS)})"
        raise bad_image(name, reason, "format") from None
    except Image.DecompressionBombError as e:
        raise bad_image(name, str(e), "size") from None
    except (BadImageError, MemoryError):
        raise
    except Exception as e:  # Pillow's plugins raise many types on corrupt or hostile data
        raise bad_image(name, str(e) or type(e).__name__) from None


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


def _libjpeg_turbo(data: bytes) -> np.ndarray:
    """torchvision's decoder (libjpeg-turbo, as in Pillow): HWC, a view of the CHW it writes."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    chw = decode_jpeg(buffer, mode=ImageReadMode.RGB, apply_exif_orientation=True)
    return chw.numpy().transpose(1, 2, 0)
