"""`python -m project optimize`: any image layout fit reads, as LitData shards per split (data/shards.py).

The splits are the data module's own (folders, --data.val_split, --data.labels_csv), so the shards hold
exactly the images and labels fit would train on. The files' bytes are stored as they are (no
re-encode); `--max_side` stores larger images downscaled. The source is only read; an output that is
not empty is refused (a second run never mixes with the first).
"""

from __future__ import annotations

import inspect
import io
import multiprocessing
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser
from PIL import Image

from project.config_checks import positive_int
from project.data import shards
from project.data.datamodule import ImageDataModule, default_num_workers
from project.data.decode import read_file
from project.data.index import ImageIndex
from project.errors import UserError, exits_on_user_error

CHUNK_BYTES = "64MB"  # LitData's advice for streaming from object storage: tens of MB per request
# Where LitData stages chunks before moving or uploading them (litdata/processing/data_processor.py)
STAGING = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")


class Sample:
    """The `fn` of litdata.optimize: one image file to its shard sample (a class: workers pickle it).

    Args:
        root: The folder the split's paths are relative to.
        max_side: Downscale images whose longer side exceeds it (re-encoded); None: bytes as they are.
    """

    def __init__(self, root: Path, max_side: int | None) -> None:
        self.root = root
        self.max_side = max_side

    def __call__(self, item: tuple[str, Any, int]) -> dict[str, Any]:
        path, label, sample_id = item
        data = read_file(self.root / path)
        if self.max_side is not None:
            data = downscaled(data, self.max_side)
        return {"image": data, "label": label, "id": sample_id, "path": path}


def downscaled(data: bytes, max_side: int) -> bytes:
    """The image with its longer side at most `max_side`: JPEG (quality 95) stays JPEG, others PNG."""
    with Image.open(io.BytesIO(data)) as image:
        if max(image.size) <= max_side:
            return data
        fmt = "JPEG" if image.format == "JPEG" else "PNG"
        image.draft("RGB", (max_side, max_side))  # JPEG: decode at a reduced scale when it can
        small = image.convert("RGB")
        small.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
        out = io.BytesIO()
        small.save(out, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        return out.getvalue()


@contextmanager
def private_staging() -> Iterator[None]:
    """A staging folder of this run's own for LitData, unless the environment names one.

    By default LitData stages in <tmp>/chunks and <tmp>/data, shared by every run on the machine,
    and empties them when a run starts (DataProcessor's shutil.rmtree of _get_cache_dir() in
    litdata/processing/data_processor.py): two optimize runs at once would delete each other's chunks.
    """
    saved = {key: os.environ.get(key) for key in STAGING}
    with tempfile.TemporaryDirectory(prefix="optimize-") as tmp:
        for key in STAGING:
            os.environ.setdefault(key, os.path.join(tmp, key.lower()))
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m project optimize",
        description="Write the data set as LitData shards per split (local folder or s3://) for "
        "`fit --data.root=OUT`: for data too many files or too remote for a folder loader.",
    )
    # the options that decide which images go into which split; the rest are for training
    layout = {"root", "val_split", "split_seed", "num_classes", "labels_csv", "label_delimiter"}
    skip = set(inspect.signature(ImageDataModule.__init__).parameters) - layout - {"self"}
    p.add_class_arguments(ImageDataModule, "data", skip=skip)
    p.add_argument("--output", type=str, required=True, help="Folder or s3://bucket/prefix; must be empty.")
    p.add_argument("--max_side", type=int | None, default=None, help="Downscale longer sides above this.")
    p.add_argument("--workers", type=int | None, default=None, help="Processes; default one per core.")
    return p


def write_split(index: ImageIndex, url: str, max_side: int | None, workers: int) -> dict[str, Any]:
    """One split's images as shards at `url` (litdata.optimize); its image and class counts."""
    labels = index.labels
    items = [
        (os.fsdecode(index.paths[i]), labels[i] if labels.ndim == 2 else int(labels[i]), i)
        for i in range(len(index))
    ]
    print(f"{len(items)} images -> {url}", flush=True)
    # LitData sets the start method process-wide (force=True): put the caller's back afterwards, or
    # every later pool in this process (cleanlab's in `audit`, a notebook's own) would spawn too
    previous = multiprocessing.get_start_method(allow_none=True)
    try:
        shards.litdata().optimize(
            fn=Sample(index.root, max_side),
            inputs=items,
            output_dir=url,
            chunk_bytes=CHUNK_BYTES,
            num_workers=min(workers, len(items)),
            reorder_files=False,  # the ids stay the positions in the split
            start_method="spawn",  # workers forked from a process with running threads can deadlock
        )
    finally:
        multiprocessing.set_start_method(previous, force=True)
    if shards.is_url(url):
        shards.check_uploaded(url)
    return {"count": len(index), "class_counts": index.class_counts()}


@exits_on_user_error
def main(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    if args.max_side is not None:
        positive_int("max_side", args.max_side)
    workers = args.workers if args.workers is not None else default_num_workers()
    positive_int("workers", workers)
    out = str(args.output)
    data = ImageDataModule(**args.data.as_dict())
    if data.shards is not None:
        raise UserError(
            f"--data.root '{data.shards}' holds shards already: optimize reads image files.",
            "point --data.root at a folder of images (or --data.labels_csv at a labels CSV).",
        )
    if not shards.output_is_empty(out):
        raise UserError(
            f"--output '{out}' is not empty (shards of an earlier run, or other files).",
            "give a new folder or prefix (e.g. with a version suffix), or delete the old one first.",
        )
    if shards.is_url(out):
        shards.allow_plain_http()
    splits = data.splits  # the data module's layouts, checks and split rules
    summary: dict[str, Any] = {}
    with private_staging():
        for name, index in splits.items():
            summary[name] = write_split(index, shards.join(out, name), args.max_side, workers)
    shards.write_index(
        out,
        {
            "format": shards.FORMAT,
            "task": data.task,
            "class_names": list(splits["train"].class_names),
            "splits": summary,
            "source": str(data.root.resolve()),
            "max_side": args.max_side,
        },
    )
    total = sum(s["count"] for s in summary.values())
    print(f"Wrote {total} images in {len(summary)} splits to {out}; train with --data.root={out}")
