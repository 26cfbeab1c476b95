"""A corpus of troublesome files for an image folder, and what loading each one must do.

`make_corpus(folder)` writes every case into `folder` and returns them; each case says whether the
index must ignore it, the decoder must load it (with the expected shape), or report it as bad.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class Case:
    kind: str
    name: str | bytes  # bytes: a file name that is not valid UTF-8
    outcome: str  # "load", "bad" or "ignored"
    detail: str  # load: the shape "3xHxW"; bad: a phrase of the reason; ignored: why
    make: Callable[[Path], None]

    def path(self, folder: Path) -> Path:
        return folder / (os.fsdecode(self.name) if isinstance(self.name, bytes) else self.name)


def _noise(w: int, h: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(w * 1000 + h)
    channels = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
    array = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
    return Image.fromarray(array[..., 0] if channels == 1 else array, mode)


def _encoded(img: Image.Image, fmt: str, **save: object) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **save)
    return buffer.getvalue()


def _writer(data: Callable[[], bytes]) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data())


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_bomb() -> bytes:
    """A valid 1-bit PNG of 20000 x 20000 pixels (about 400 million, > 2x Pillow's limit) in ~60 kB."""
    side = 20000
    row = b"\x00" + b"\x00" * (side // 8)
    compressor = zlib.compressobj(9)
    body = b"".join(compressor.compress(row * 1000) for _ in range(side // 1000)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", body)
        + _png_chunk(b"IEND", b"")
    )


def _jpeg_bomb() -> bytes:
    """A small JPEG whose header claims 60000 x 60000 pixels (10.8 GB once decoded to RGB)."""
    data = bytearray(_encoded(_noise(16, 16), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 60000)
    return bytes(data)


def _exif_rotated() -> bytes:
    img = _noise(30, 10)
    exif = img.getexif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise: 10 wide, 30 high
    return _encoded(img, "JPEG", exif=exif)


def _palette_transparent() -> bytes:
    img = _noise(12, 8).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    return _encoded(img, "PNG", transparency=0)


def _animated_gif() -> bytes:
    frames = [_noise(14, 9).convert("P"), _noise(14, 10).convert("P"), _noise(15, 9).convert("P")]
    return _encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)


def _png16() -> bytes:
    return _encoded(Image.fromarray(np.full((6, 10), 40000, dtype=np.uint16)), "PNG")


def _symlink(path: Path) -> None:
    path.symlink_to(path.with_name("does-not-exist.jpg"))


def _unreadable(path: Path) -> None:
    path.write_bytes(_encoded(_noise(8, 8), "JPEG"))
    path.chmod(0)


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # opening it for reading would wait forever for a writer


CASES = [
    Case("zero bytes", "empty.jpg", "bad", "empty", _writer(lambda: b"")),
    Case(
        "truncated JPEG",
        "truncated.jpg",
        "bad",
        "truncated",
        _writer(lambda: _encoded(_noise(64, 48), "JPEG")[:1500]),
    ),
    Case(
        "truncated PNG",
        "truncated.png",
        "bad",
        "truncated",
        _writer(lambda: _encoded(_noise(64, 48), "PNG")[:3000]),
    ),
    Case(
        "random bytes named .jpg",
        "random.jpg",
        "bad",
        "cannot identify",
        _writer(lambda: np.random.default_rng(1).bytes(3000)),
    ),
    Case("text named .jpg", "notes.jpg", "bad", "cannot identify", _writer(lambda: b"not an image\n" * 20)),
    Case(
        "PNG named .jpg",
        "really-png.jpg",
        "load",
        "3x13x21",
        _writer(lambda: _encoded(_noise(21, 13), "PNG")),
    ),
    Case(
        "text file in a class folder",
        "README.txt",
        "ignored",
        "not an image extension",
        _writer(lambda: b"hi\n"),
    ),
    Case("decompression bomb (PNG)", "bomb.png", "bad", "decompression bomb", _writer(_png_bomb)),
    Case("decompression bomb (JPEG header)", "bomb.jpg", "bad", "decompression bomb", _writer(_jpeg_bomb)),
    Case("1x1 image", "dot.png", "load", "3x1x1", _writer(lambda: _encoded(_noise(1, 1), "PNG"))),
    Case(
        "extreme aspect ratio (1x1,000,000 PNG, 2 kB)",
        "line.png",
        "bad",
        "aspect ratio beyond the limit of 100:1",
        _writer(lambda: _encoded(Image.new("L", (1, 1_000_000)), "PNG")),
    ),
    Case("16-bit PNG", "deep.png", "load", "3x6x10", _writer(_png16)),
    Case(
        "CMYK JPEG",
        "cmyk.jpg",
        "load",
        "3x9x11",
        _writer(lambda: _encoded(_noise(11, 9).convert("CMYK"), "JPEG")),
    ),
    Case("RGBA PNG", "alpha.png", "load", "3x7x5", _writer(lambda: _encoded(_noise(5, 7, "RGBA"), "PNG"))),
    Case("palette PNG with transparency", "palette.png", "load", "3x8x12", _writer(_palette_transparent)),
    Case("animated GIF (first frame)", "animated.gif", "load", "3x9x14", _writer(_animated_gif)),
    Case("EXIF-rotated JPEG", "rotated.jpg", "load", "3x30x10", _writer(_exif_rotated)),
    Case(
        "upper-case extension", "SHOUT.JPG", "load", "3x8x8", _writer(lambda: _encoded(_noise(8, 8), "JPEG"))
    ),
    Case("broken symlink", "dangling.jpg", "bad", "no such file", _symlink),
    Case("unreadable file (mode 000)", "locked.jpg", "bad", "permission denied", _unreadable),
    Case("named pipe named .jpg", "pipe.jpg", "bad", "not a regular file", _fifo),
    Case(
        "file name that is not valid UTF-8",
        b"caf\xe9-latin1.jpg",
        "load",
        "3x8x8",
        _writer(lambda: _encoded(_noise(8, 8), "JPEG")),
    ),
    Case("hidden .DS_Store", ".DS_Store", "ignored", "hidden file", _writer(lambda: b"\x00\x00\x00\x01Bud1")),
    Case(
        "hidden AppleDouble ._x.jpg",
        "._photo.jpg",
        "ignored",
        "hidden file",
        _writer(lambda: b"\x00\x05\x16\x07" + b"\x00" * 80),
    ),
]


def make_corpus(folder: Path) -> list[Case]:
    """Write every case into `folder` (created if needed) and return the cases."""
    folder.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        case.make(case.path(folder))
    return CASES
