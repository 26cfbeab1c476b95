import io
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.data.decode import (
    MAX_ASPECT_RATIO,
    MAX_FILE_BYTES,
    BadImageError,
    _libjpeg_turbo,
    load_rgb,
    read_rgb,
)
from project.deploy.classifier import Classifier

# room: serve begin
from project.deploy.serve import bodies

# room: serve end
from tests.exports import tiny_export
from tests.helpers import write_image


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


def test_a_huge_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge.jpg"
    small = tmp_path / "small.jpg"
    Image.new("RGB", (8, 8)).save(small)
    path.write_bytes(small.read_bytes())
    with open(path, "r+b") as f:
        f.truncate(4 << 30)  # 4 GB, sparse: nothing is written, and nothing may be read
    for read in (load_rgb, read_rgb):
        with pytest.raises(BadImageError) as caught:
            read(path)
        assert caught.value.kind == "size"
        assert str(caught.value).startswith(
            f"Cannot decode image '{path}': it is 4,294,967,296 bytes, more than the limit of "
            f"{MAX_FILE_BYTES:,} bytes for one image file. Fix: delete or replace the file"
        )


def _noise(width: int, height: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(width * 7919 + height)
    smooth = np.cumsum(rng.normal(0, 12, (height, width, 3)), axis=1) % 256  # photo-like and noisy
    return Image.fromarray(smooth.astype(np.uint8)).convert(mode)


def _rotated(orientation: int, fmt: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        img = _noise(31, 12)
        exif = img.getexif()
        exif[0x0112] = orientation
        img.save(path, fmt, exif=exif)

    return write


def _save(img: Callable[[], Image.Image], fmt: str, **options: object) -> Callable[[Path], None]:
    return lambda path: img().save(path, fmt, **options)


def _palette_transparent() -> Image.Image:
    return _noise(12, 8).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)


def _animated(path: Path) -> None:
    frames = [_noise(14, 9).convert("P"), _noise(14, 9).convert("P")]
    frames[0].save(path, "GIF", save_all=True, append_images=frames[1:], duration=50)


# every mode the index accepts, with the suffix it is stored under: name -> writer
MODES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "16-bit PNG (I;16)": (
        "png",
        _save(lambda: Image.fromarray((np.arange(600, dtype=np.uint16) * 109).reshape(20, 30)), "PNG"),
    ),
    "palette PNG with transparency": ("png", _save(_palette_transparent, "PNG", transparency=0)),
    "RGBA PNG": ("png", _save(lambda: _noise(13, 9, "RGBA"), "PNG")),
    "LA PNG": ("png", _save(lambda: _noise(13, 9, "LA"), "PNG")),
    "1-bit PNG": ("png", _save(lambda: _noise(13, 9, "1"), "PNG")),
    "grayscale PNG": ("png", _save(lambda: _noise(13, 9, "L"), "PNG")),
    "grayscale JPEG": ("jpg", _save(lambda: _noise(33, 17, "L"), "JPEG")),
    "CMYK JPEG": ("jpg", _save(lambda: _noise(33, 17, "CMYK"), "JPEG")),
    "RGB JPEG 4:4:4": ("jpg", _save(lambda: _noise(33, 17), "JPEG", subsampling=0, quality=95)),
    "RGB JPEG 4:2:0, odd size": ("jpg", _save(lambda: _noise(33, 17), "JPEG", subsampling=2)),
    "progressive JPEG": ("jpg", _save(lambda: _noise(40, 30), "JPEG", progressive=True)),
    **{f"EXIF orientation {o} JPEG": ("jpg", _rotated(o, "JPEG")) for o in range(1, 9)},
    "EXIF orientation 6 PNG": ("png", _rotated(6, "PNG")),
    "tiny 1x1 JPEG": ("jpg", _save(lambda: _noise(1, 1), "JPEG")),
    "tiny 1x1 PNG": ("png", _save(lambda: _noise(1, 1), "PNG")),
    "huge 3000x2000 JPEG": ("jpg", _save(lambda: _noise(300, 200).resize((3000, 2000)), "JPEG")),
    "animated GIF": ("gif", _animated),
    "BMP": ("bmp", _save(lambda: _noise(13, 9), "BMP")),
    "WebP": ("webp", _save(lambda: _noise(13, 9), "WEBP")),
    "TIFF": ("tiff", _save(lambda: _noise(13, 9), "TIFF")),
    "PGM": ("pgm", _save(lambda: _noise(13, 9, "L"), "PPM")),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_training_and_torch_free_paths_decode_the_same_pixels(tmp_path: Path, mode: str) -> None:
    suffix, write = MODES[mode]
    path = tmp_path / f"image.{suffix}"
    write(path)
    training = load_rgb(path).permute(1, 2, 0).numpy()  # fit, validate, test, predict
    served, _ = bodies.decode(path.read_bytes(), max_pixels=10**8)  # room: serve
    assert np.array_equal(read_rgb(path), training)  # infer
    assert np.array_equal(np.asarray(served), training)  # room: serve
    if suffix == "jpg":  # the libjpeg-turbo path really decoded it (no fallback to Pillow)
        assert np.array_equal(_libjpeg_turbo(path.read_bytes()), training)


def test_16_bit_images_mean_the_same_to_infer(tmp_path: Path) -> None:
    Image.fromarray(np.full((20, 30), 32768, dtype=np.uint16)).save(tmp_path / "deep.png")
    tiny_export(tmp_path, "m", seed=0)
    classifier = Classifier(tmp_path / "m.onnx")
    assert np.unique(classifier.preprocess(tmp_path / "deep.png")).tolist() == [128]  # not 255
    assert np.unique(classifier.preprocess((tmp_path / "deep.png").read_bytes())).tolist() == [128]


@pytest.mark.parametrize(("width", "height"), [(1, 1_000_000), (1_000_000, 1), (3, 301)])
def test_extreme_aspect_ratios_are_refused_before_decoding(tmp_path: Path, width: int, height: int) -> None:
    path = tmp_path / "line.png"
    Image.new("L", (width, height)).save(path)
    started = time.perf_counter()
    for load in (load_rgb, read_rgb):
        with pytest.raises(BadImageError, match=rf"{width}x{height} pixels, an aspect ratio beyond") as e:
            load(path)
        assert e.value.kind == "shape"
    assert time.perf_counter() - started < 2  # it took 20 s and 7 GB to resize


def test_the_aspect_ratio_limit_holds_for_jpeg_headers_and_admits_100_to_1(tmp_path: Path) -> None:
    Image.new("RGB", (2, 201)).save(tmp_path / "tall.jpg")
    with pytest.raises(BadImageError, match=r"2x201 pixels, an aspect ratio beyond the limit of 100:1"):
        load_rgb(tmp_path / "tall.jpg")
    Image.new("RGB", (MAX_ASPECT_RATIO * 2, 2)).save(tmp_path / "wide.jpg")
    assert tuple(load_rgb(tmp_path / "wide.jpg").shape) == (3, 2, 200)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"P3\n300 300\n255\n" + b"255 255 255\n" * 90_000, "plain (ASCII) Netpbm file (P3)"),
        (b"P1\n800 800\n" + b"0 1\n" * 320_000, "plain (ASCII) Netpbm file (P1)"),
        (b"P6\n#" + b"x" * 2_000_000 + b"\n2 2\n255\n" + bytes(12), "binary Netpbm file (P6)"),
    ],
)
def test_netpbm_that_pillow_parses_a_byte_at_a_time_is_refused_from_its_first_bytes(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    path = tmp_path / "hostile.ppm"
    path.write_bytes(content)
    started = time.perf_counter()
    with pytest.raises(BadImageError, match=r"header of at most 1024 bytes") as refused:
        read_rgb(path)
    assert time.perf_counter() - started < 0.1  # Pillow took 0.3 to 1 s on each of these
    assert reason in refused.value.reason and refused.value.kind == "format"


def test_binary_netpbm_with_a_header_comment_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "small.ppm"
    path.write_bytes(b"P6 # made by hand\n2 1\n255\n" + bytes([255, 0, 0, 0, 0, 255]))
    assert read_rgb(path).tolist() == [[[255, 0, 0], [0, 0, 255]]]


def _jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 30, 30)).save(buffer, "JPEG")
    return buffer.getvalue()


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def _gif_with(extension: bytes) -> bytes:
    buffer = io.BytesIO()
    Image.new("P", (4, 4)).save(buffer, "GIF")
    gif = buffer.getvalue()
    image = gif.index(b",")  # the first image descriptor, after the colour table
    return gif[:image] + extension + gif[image:]


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


HEADERS_OF_EMPTY_STEPS = {  # what Pillow parsed a step at a time in Python: seconds each before
    "JPEG, 12 MB of fill bytes (30 s)": lambda: _jpeg()[:2] + b"\xff" * 12_000_000 + _jpeg()[2:],
    "JPEG, 1M empty comments (6 s)": lambda: _jpeg()[:2] + b"\xff\xfe\x00\x02" * 1_000_000 + _jpeg()[2:],
    "JPEG, 1 MB of junk after its first segment": lambda: _jpeg()[:20] + bytes(1_000_000) + _jpeg()[20:],
    "PNG, 1M empty chunks (15 s)": lambda: _png()[:33] + _png_chunk(b"zzZz", b"") * 1_000_000 + _png()[33:],
    "GIF, 2M one-byte sub-blocks (2 s)": lambda: _gif_with(b"!\xfe" + b"\x01x" * 2_000_000 + b"\x00"),
}


@pytest.mark.parametrize("case", HEADERS_OF_EMPTY_STEPS)
def test_headers_of_millions_of_empty_steps_are_refused_at_once(tmp_path: Path, case: str) -> None:
    path = tmp_path / "hostile.img"
    path.write_bytes(HEADERS_OF_EMPTY_STEPS[case]())
    started = time.perf_counter()
    with pytest.raises(BadImageError, match=r"Cannot decode image '.*hostile.img': ") as refused:
        read_rgb(path)
    assert time.perf_counter() - started < 0.5
    assert refused.value.kind == "corrupt"
    assert "which Pillow would read one at a time" in refused.value.reason or "not a JPEG marker" in (
        refused.value.reason
    )


def test_real_headers_of_many_steps_still_decode(tmp_path: Path) -> None:
    """A 100 kB GIF comment (400 sub-blocks), 1,000 PNG text chunks, a JPEG of 64 kB EXIF and ICC segments."""
    comment = b"!\xfe" + (b"\xff" + b"c" * 255) * 400 + b"\x00"
    texts = b"".join(_png_chunk(b"tEXt", b"k\x00%d" % i) for i in range(1000))
    rgb = Image.new("RGB", (40, 30), (200, 30, 30))
    jpeg = io.BytesIO()
    rgb.save(jpeg, "JPEG", exif=b"Exif\x00\x00" + bytes(60_000), icc_profile=bytes(200_000))
    for name, data in {
        "c.gif": _gif_with(comment),
        "t.png": _png()[:33] + texts + _png()[33:],
        "e.jpg": jpeg.getvalue(),
    }.items():
        (tmp_path / name).write_bytes(data)
        assert read_rgb(tmp_path / name).shape[2] == 3, name
