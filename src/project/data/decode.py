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
import re
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
_JPEG_STANDALONE = frozenset({0x01, 0xD8, *range(0xD0, 0xD8)})  # markers without a length
# Pillow parses the segments of a JPEG header, the chunks of a PNG and the extension blocks of a
# GIF in Python, a step each: a few kB of real header is tens of steps, but a file made of empty
# ones is millions (seconds to minutes of CPU within every pixel and byte limit). Beyond this
# many (PNG: plus one per kB of file), a file is refused before Pillow sees it.
MAX_HEADER_UNITS = 4096
# Resizing the short side to the model's input lets the long side grow with the aspect ratio: a
# 2 KB PNG of 1x1,000,000 pixels became a 7 GB resize. Photos, panoramas and web banners stay far below.
MAX_ASPECT_RATIO = 100
# A file is read whole before its header is checked: a 4 GB file in an image folder was read into
# memory (in each loader worker) first. No image worth decoding is larger than an uncompressed 8-bit
# RGBA one at Pillow's pixel limit (2 x 89.5 M pixels x 4 bytes = 716 MB): larger files are refused unread.
MAX_FILE_BYTES = 1 << 30

# Netpbm as Pillow reads it costs Python work per byte: header comments are skipped a byte at a
# time and plain (P1-P3) pixels are parsed in Python (a 15 MB plain PPM held a core for about a
# minute, within every pixel and body limit). Only binary Netpbm (P4-P6) is opened, and only when
# its header (magic, sizes, maxval, comments) ends within NETPBM_HEADER_BYTES.
NETPBM_HEADER_BYTES = 1024
_NETPBM_HEADER = re.compile(rb"P[456](?:(?:\s|#[^\r\n]*[\r\n])+\d+){2,3}\s")

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
    return decode_chw(read_file(path), path)


def decode_chw(data: bytes, name: str | Path) -> torch.Tensor:
    """uint8 [3, H, W] of an image file's bytes (from a file or a shard), JPEGs through libjpeg-turbo."""
    import torch  # here, not at the top: infer and serve import this module without torch

    chw = decode_rgb(data, name, jpeg=_libjpeg_turbo).transpose(2, 0, 1)
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
    size = _jpeg_size(data, name) if data.startswith(JPEG_MAGIC) else None
    if size is not None:  # checked here too: the libjpeg path never asks Pillow
        _check_header(name, size, limit)
        if jpeg is not None:
            try:
                return jpeg(data), "JPEG"
            except (RuntimeError, ValueError):
                pass  # unusual JPEGs (some CMYK or lossless variants): Pillow decides
    return _decode_with_pil(data, name, limit)


def read_header(data: bytes, name: str | Path, max_pixels: int | None = None) -> tuple[int, int, str]:
    """(width, height, format) from the header alone, with `decode_image`'s refusals of format and size.

    What a caller needs to know what decoding will cost before any pixel is decoded (serve counts
    it against its memory budget).
    """
    if not data:
        raise bad_image(name, "the file is empty", "empty")
    image_format = sniff_format(data, name)
    size = _jpeg_size(data, name) if image_format == "JPEG" else None
    if size is None:
        try:
            with Image.open(io.BytesIO(data), formats=[image_format]) as img:  # reads the header only
                size = img.size
        except Image.DecompressionBombError as e:
            raise bad_image(name, str(e), "size") from None
        except Exception as e:  # Pillow's plugins raise many types on corrupt or hostile data
            raise bad_image(name, str(e) or type(e).__name__) from None
    _check_header(name, size, max_pixels if max_pixels is not None else _pillow_limit())
    return size[0], size[1], image_format


def _pillow_limit() -> int | None:
    return None if Image.MAX_IMAGE_PIXELS is None else 2 * Image.MAX_IMAGE_PIXELS


def _jpeg_size(data: bytes, name: str | Path) -> tuple[int, int] | None:
    """(width, height) from a JPEG's start-of-frame header, without decoding; None if not found.

    Walks the segments up to the scan, as Pillow's parser does a step at a time in Python, and
    refuses a header it would spend long on: more than MAX_HEADER_UNITS markers and fill bytes
    (a 12 MB run of fill bytes took 30 s), or bytes that are not a marker between segments
    (Pillow skips those a byte at a time). A header cut short is left to the decoder to name.
    """
    i, size = 2, None
    for _ in range(MAX_HEADER_UNITS):
        if i + 4 > len(data):
            return size
        if data[i] != 0xFF:
            raise bad_image(
                name, f"byte {i} of its header is not a JPEG marker: the file is damaged", "corrupt"
            )
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0xDA:  # start of scan: the header is complete
            return size
        if marker in _JPEG_SOF and size is None and i + 9 <= len(data):
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            size = (width, height)
        if marker in _JPEG_STANDALONE:
            i += 2
            continue
        i += 2 + struct.unpack(">H", data[i + 2 : i + 4])[0]
    raise bad_image(name, _too_many("markers and fill bytes before its image data"), "corrupt")


def _png_chunks(data: bytes, name: str | Path) -> None:
    """Refuse a PNG of more chunks than its size explains: Pillow reads each in Python (1M took 15 s)."""
    limit = MAX_HEADER_UNITS + len(data) // 1024  # encoders write image data in chunks of 8 kB and more
    position = 8
    for _ in range(limit):
        if position + 8 > len(data):
            return
        length, kind = struct.unpack_from(">I4s", data, position)
        if kind == b"IEND":
            return
        position += 12 + length
    raise bad_image(name, _too_many(f"PNG chunks in its {len(data)} bytes", limit), "corrupt")


def _gif_blocks(data: bytes, name: str | Path) -> None:
    """Refuse a GIF whose extensions before the first image have more than MAX_HEADER_UNITS sub-blocks.

    Pillow reads each in Python (4 MB of 1-byte sub-blocks took 2 s); the image data is read in C.
    """
    flags = data[10] if len(data) > 10 else 0
    position = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # after the global colour table
    units = 0
    while position + 2 <= len(data) and data[position] == 0x21:  # "!": an extension
        position += 2
        while position < len(data) and data[position]:  # sub-blocks until an empty one
            units += 1
            if units > MAX_HEADER_UNITS:
                raise bad_image(name, _too_many("sub-blocks of extensions before its first image"), "corrupt")
            position += 1 + data[position]
        position += 1


def _too_many(what: str, limit: int | None = None) -> str:
    return (
        f"more than {limit or MAX_HEADER_UNITS} {what}, which Pillow would read one at a time in Python "
        "(real images have tens): a damaged or hostile file"
    )


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


def sniff_format(data: bytes, name: str | Path) -> str:
    """The format in FORMATS that `data`'s magic bytes announce; BadImageError ("format") otherwise.

    Checked before Pillow parses anything, so that only the one plugin of that format ever sees
    the bytes (Pillow would try each plugin whose own check accepts them).
    """
    head = data[:12]
    if head.startswith(JPEG_MAGIC):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        _png_chunks(data, name)
        return "PNG"
    if head.startswith((b"GIF87a", b"GIF89a")):
        _gif_blocks(data, name)
        return "GIF"
    if head.startswith(b"BM"):
        return "BMP"
    if head.startswith((b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")):  # classic and BigTIFF
        return "TIFF"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "WEBP"
    if _NETPBM_HEADER.match(data[:NETPBM_HEADER_BYTES]):
        return "PPM"
    if re.match(rb"P[1-6]", head):
        kind = "plain (ASCII)" if head[1:2] in b"123" else "binary"
        reason = (
            f"it is a {kind} Netpbm file (P{head[1:2].decode()}); only binary Netpbm (P4, P5, P6) with a "
            f"header of at most {NETPBM_HEADER_BYTES} bytes is read (plain pixels and long header comments "
            "are parsed a byte at a time); convert it to PNG"
        )
        raise bad_image(name, reason, "format")
    reason = f"cannot identify an image in a format training reads ({', '.join(FORMATS)})"
    raise bad_image(name, reason, "format")


def _decode_with_pil(data: bytes, name: str | Path, max_pixels: int | None) -> tuple[np.ndarray, str]:
    image_format = sniff_format(data, name)
    try:
        with Image.open(io.BytesIO(data), formats=[image_format]) as img:  # reads the header only
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


def pil_rgb(img: Image.Image) -> np.ndarray:
    """uint8 [H, W, 3] of an image already opened by Pillow, by a file's rule: upright per EXIF,
    16-bit scaled, palette transparency and alpha as the decoder handles them."""
    return _to_rgb_array(ImageOps.exif_transpose(img))


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
