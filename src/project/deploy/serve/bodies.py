"""From an untrusted request body to a checked, decoded image, or a RequestError with its HTTP status.

Every limit holds before the expensive step it protects: the declared and the received body size
before the body is kept, the read time before a slow client can hold a request open forever, the
pixel count in the image header before anything is decoded. Only the formats that training reads
are opened, which also keeps Pillow's riskier plugins (EPS, which runs Ghostscript) out of reach.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from PIL import Image
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request

from project.data.decode import FORMATS, BadImageError, decode_image, read_header

# Peak memory of decoding and preprocessing one image, in bytes per pixel of the size its header
# gives: Pillow's image (4 bytes a pixel, RGB too), its upright and RGB copies, the numpy array and
# the resize's input. Measured (VmHWM) on 3000x2000 images, animated or not: 18 for JPEG, PNG, BMP,
# TIFF and PPM, 12 for GIF, 27 for WebP (libwebp's animation decoder keeps canvases of its own).
DECODE_BYTES_PER_PIXEL = {"WEBP": 27, "GIF": 12}
DEFAULT_DECODE_BYTES_PER_PIXEL = 18
RAW_TYPES = ("application/octet-stream", "")  # plus image/*; no Content-Type at all counts as raw
FIX_TYPE = (
    "send the image file as the body with Content-Type: image/jpeg (png, ...) or application/octet-stream, "
    "or as multipart/form-data with a file field named 'file' (curl -F file=@photo.jpg)."
)


class RequestError(Exception):
    """A request the service refuses: the status, and a message naming what was wrong and the fix."""

    def __init__(self, status: int, problem: str, fix: str | None = None) -> None:
        super().__init__(problem if fix is None else f"{problem} Fix: {fix}")
        self.status = status


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int
    max_pixels: int
    read_timeout_s: float


async def image_bytes(request: Request, limits: Limits) -> bytes:
    """The image file a /predict request carries: the raw body, or the multipart part named 'file'."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in RAW_TYPES and not content_type.startswith(("image/", "multipart/form-data")):
        raise RequestError(415, f"Content-Type '{content_type}' is not an image or a file upload.", FIX_TYPE)
    body = await read_body(request, limits)
    if content_type == "multipart/form-data":
        body = await multipart_file(request, body)
    if not body:
        raise RequestError(400, "The request carries no image: the body is empty.", FIX_TYPE)
    return body


async def read_body(request: Request, limits: Limits) -> bytes:
    """The whole body, refused (413) past max_body_bytes and (408) past read_timeout_s."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise too_large(int(declared), limits)
    try:
        return await asyncio.wait_for(_read_capped(request, limits), limits.read_timeout_s)
    except ClientDisconnect:  # nobody is left to read the answer; this keeps it out of the error log
        raise RequestError(400, "The client closed the connection before sending the whole body.") from None
    except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
        raise RequestError(
            408,
            f"The body did not arrive within {limits.read_timeout_s:g} s.",
            "send the whole body promptly (its Content-Length must match what is sent), "
            "or raise --read_timeout for slow links.",
        ) from None


async def _read_capped(request: Request, limits: Limits) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_body_bytes:  # chunked bodies declare no length up front
            raise too_large(size, limits)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(size: int, limits: Limits) -> RequestError:
    return RequestError(
        413,
        f"The body has {'at least ' if size > limits.max_body_bytes else ''}{size} bytes, "
        f"more than the limit of {limits.max_body_bytes}.",
        "send a smaller image (the model sees it resized anyway), or raise --max_body_mb.",
    )


async def multipart_file(request: Request, body: bytes) -> bytes:
    """The bytes of the part named 'file' (else the only file part) of a multipart body."""

    async def replay() -> AsyncIterator[bytes]:  # the body is already read, within the limits
        yield body

    try:
        form = await MultiPartParser(request.headers, replay(), max_files=4, max_fields=16).parse()
    except MultiPartException as e:
        raise RequestError(400, f"The multipart body cannot be parsed: {e.message}", FIX_TYPE) from None
    files = [value for _, value in form.multi_items() if isinstance(value, UploadFile)]
    named = form.get("file")
    upload = named if isinstance(named, UploadFile) else files[0] if len(files) == 1 else None
    try:
        if upload is None:
            names = [key for key, _ in form.multi_items()]
            raise RequestError(
                400, f"The multipart body has no file part named 'file' (parts: {names}).", FIX_TYPE
            )
        return await upload.read()
    finally:
        await form.close()


def decoding_cost(data: bytes, max_pixels: int) -> tuple[int, int, int]:
    """(bytes decoding `data` will hold at its peak, width, height), from its header alone.

    The same RequestErrors as `decode` for what the header already shows (format, pixels, shape).
    """
    try:
        width, height, image_format = read_header(data, "the body", max_pixels)
    except BadImageError as e:
        raise refusal(e, data) from None
    per_pixel = DECODE_BYTES_PER_PIXEL.get(image_format, DEFAULT_DECODE_BYTES_PER_PIXEL)
    return width * height * per_pixel, width, height


def decode(data: bytes, max_pixels: int) -> tuple[Image.Image, str | None]:
    """(upright RGB image, format) of untrusted bytes, by training's rule (`project.data.decode`).

    RequestError 415 (not an image in FORMATS), 413 (more pixels than `max_pixels`), 400 (corrupt,
    or an aspect ratio beyond decode.MAX_ASPECT_RATIO).
    """
    try:
        pixels, image_format = decode_image(data, "the body", max_pixels)
    except BadImageError as e:
        raise refusal(e, data) from None
    return Image.fromarray(pixels), image_format


def refusal(error: BadImageError, data: bytes) -> RequestError:
    """The HTTP answer to an image the decoder refused."""
    if error.kind == "format":
        return RequestError(
            415,
            f"The body ({len(data)} bytes, starting {data[:8]!r}) is not an image the service reads: "
            f"{error.reason}.",
            f"send a file in one of {', '.join(FORMATS)} (Netpbm: binary only).",
        )
    if error.kind == "size":
        return RequestError(
            413,
            f"The image is too large to decode: {error.reason}.",
            "send a smaller image (the model sees it resized anyway), or raise --max_pixels.",
        )
    if error.kind == "shape":
        return RequestError(400, f"The image cannot be used: {error.reason}.", "send a less elongated image.")
    return RequestError(
        400, f"The image cannot be decoded ({error.reason}).", "send a complete, uncorrupted image file."
    )
