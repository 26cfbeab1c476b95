"""Decode every image of a split once into one uint8 buffer that loader workers read without copying.

For small-image data sets (CIFAR-sized JPEGs) decoding is a large share of an epoch; with
`--data.cache=true` each file is decoded once, at setup, and every later epoch reads the buffer.
`--data.cache=auto` (the default) does so by itself when `fit` finds small images that fit
comfortably in memory (`auto_cache`: the rule is there).
The buffer is data/decoded.py's `DecodedImages`: forked workers share its pages and never copy them.
Transforms still run per epoch: the per-image ones give exactly the uncached path's samples; a
training split of one image size is augmented a batch at a time instead (data/batch_augment.py's
`CachedBatches`).
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from project.data.decode import BadImageError, load_rgb
from project.data.decoded import DecodedImages
from project.data.index import ImageIndex
from project.data.skipped import SkipLog
from project.errors import UserError

MEMORY_SHARE = 0.5  # at most this share of the available memory may hold the decoded images
SAMPLE = 64  # images decoded to estimate the whole cache before decoding it
# --data.cache=auto caches when the images average at most this many pixels: decoding is a large
# share of a sample's cost from CIFAR's 32x32 to photos of a few hundred pixels a side (ELPV's 300x300
# PNGs: a photos.yaml epoch 1.35x faster cached, docs/benchmarks.md) ...
AUTO_MAX_PIXELS = 512 * 512
# ... and the decoded train + val images of every process on this machine take at most this share
# of the available memory (twice that while the buffer is built: still under half).
AUTO_MEMORY_SHARE = 0.25
CHUNK = 256  # images per message from a decoding worker


class _Decode(Dataset):
    """Image i decoded, or the reason it is bad: run in loader workers."""

    def __init__(self, index: ImageIndex) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> torch.Tensor | str:
        try:
            return load_rgb(self.index.path(i))
        except BadImageError as e:
            return e.reason


def _flatten(images: list[torch.Tensor | str]) -> tuple[torch.Tensor, torch.Tensor, list[str | None]]:
    """A chunk as one flat tensor: one shared-memory handle per chunk instead of one per image."""
    good = [im for im in images if not isinstance(im, str)]
    flat = torch.cat([im.reshape(-1) for im in good]) if good else torch.empty(0, dtype=torch.uint8)
    shapes = torch.tensor(
        [(0, 0, 0) if isinstance(im, str) else im.shape for im in images], dtype=torch.int32
    )
    return flat, shapes, [im if isinstance(im, str) else None for im in images]


def decode_all(
    index: ImageIndex,
    split: str,
    num_workers: int,
    skip_bad_images: bool,
    skip_log: SkipLog | None = None,
    available: int | None = None,
) -> DecodedImages:
    """Decode every file of `index` once (in `num_workers` processes); refuse before if it cannot fit."""
    _check_fits(index, split, available if available is not None else available_memory())
    started = time.perf_counter()
    # a generator of its own: a loader draws its workers' seed from the global stream otherwise, and a
    # cached fit would then not be the uncached one of the same --seed_everything
    generator = torch.Generator()
    loader = DataLoader(
        _Decode(index), batch_size=CHUNK, num_workers=num_workers, collate_fn=_flatten, generator=generator
    )
    chunks, shapes = [], []
    for start, (flat, chunk_shapes, reasons) in zip(range(0, len(index), CHUNK), loader, strict=True):
        for i, reason in enumerate(reasons, start):
            if reason is None:
                continue
            if not skip_bad_images:
                load_rgb(index.path(i))  # raises the error that names the file and the fix
            if skip_log is not None:
                skip_log.add(index.path(i), reason)
        chunks.append(flat.clone())  # out of the worker's shared memory: its handle is released
        shapes.append(chunk_shapes)
    all_shapes = torch.cat(shapes)
    sizes = all_shapes.to(torch.int64).prod(dim=1)
    buffer = torch.cat(chunks)  # the files in index order, back to back
    del chunks
    if torch.multiprocessing.get_start_method() != "fork":
        buffer.share_memory_()  # spawned workers receive a handle to it instead of a pickled copy
    cache = DecodedImages(buffer, torch.cumsum(sizes, 0) - sizes, all_shapes)
    print(
        f"Cached {len(index):,} {split} images: {cache.nbytes / 2**20:.1f} MiB decoded in "
        f"{time.perf_counter() - started:.1f} s."
    )
    return cache


def _check_fits(index: ImageIndex, split: str, available: int) -> None:
    """Estimate the decoded size from a sample of the files; stop with the numbers if it is too large."""
    if not len(index):
        return
    step = max(1, len(index) // SAMPLE)
    sizes = []
    for i in range(0, len(index), step):
        try:
            sizes.append(load_rgb(index.path(i)).numel())
        except BadImageError:
            continue
    estimate = (sum(sizes) / max(1, len(sizes))) * len(index)
    if 2 * estimate > MEMORY_SHARE * available:  # decoded images and the buffer coexist while it is built
        raise UserError(
            f"--data.cache=true would hold the {len(index):,} {split} images decoded: about "
            f"{estimate / 2**30:.2f} GiB (twice that while it is built), more than {MEMORY_SHARE:.0%} of "
            f"the {available / 2**30:.2f} GiB of memory available.",
            "set --data.cache=false (files are then decoded every epoch), or train at a smaller source "
            "resolution (resize the files on disk once).",
        )


def header_sizes(index: ImageIndex, sample: int = SAMPLE) -> list[int]:
    """Pixel counts (width x height) of up to `sample` files spread over `index`, from their headers.

    Opening an image reads its header, not its pixels: cheap even for camera-sized photos.
    Files that cannot be opened are left out (they are reported when decoded).
    """
    pixels = []
    for i in range(0, len(index), max(1, len(index) // sample)):
        path = index.path(i)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe would block
                continue
            with Image.open(path) as image:
                pixels.append(image.width * image.height)
        except Exception:  # an estimate: whatever is wrong is reported when the file is decoded
            continue
    return pixels


@dataclass(frozen=True)
class AutoCache:
    """What `--data.cache=auto` decided, and the numbers it decided on."""

    enabled: bool
    decoded_bytes: float  # estimated, train + val, one process
    mean_pixels: float
    processes: int
    available: int

    @property
    def notice(self) -> str:
        """The one line a run prints when it caches by itself."""
        side = round(self.mean_pixels**0.5)
        each = f" per process x {self.processes}" if self.processes > 1 else ""
        return (
            f"Caching the decoded train and val images in memory (--data.cache=auto): about "
            f"{self.decoded_bytes / 2**20:,.1f} MiB{each} "
            f"of images of ~{side}x{side} px against {self.available / 2**30:.1f} GiB available. "
            f"--data.cache=false turns it off."
        )


def auto_cache(indices: list[ImageIndex], processes: int = 1, available: int | None = None) -> AutoCache:
    """Cache when the images are not large (mean <= AUTO_MAX_PIXELS) and all processes' decoded copies
    take at most AUTO_MEMORY_SHARE of the available memory."""
    available = available if available is not None else available_memory()
    total, pixels = 0.0, []
    for index in indices:
        sizes = header_sizes(index)
        pixels += sizes
        total += 3 * (sum(sizes) / max(1, len(sizes))) * len(index)  # decoded as RGB, 1 byte each
    mean_pixels = sum(pixels) / max(1, len(pixels))
    enabled = (
        bool(pixels)  # some file read: there are images
        and mean_pixels <= AUTO_MAX_PIXELS
        and processes * total <= AUTO_MEMORY_SHARE * available
    )
    return AutoCache(enabled, total, mean_pixels, processes, available)


def available_memory() -> int:
    """Bytes of memory the system can still give (MemAvailable), or physical memory where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
