"""`python -m project optimize`: any image layout fit reads, as LitData shards per split (data/shards.py).

The splits are the data module's own (whatever format it reads, --data.val_split), so the shards hold
exactly the images and labels fit would train on. Each split's samples are written in a seeded random
order (--data.split_seed): chunks and the windows LitData shuffles within then mix the classes, as a
shuffled folder does (in class order, most training batches held one class and a model stayed at
chance). Each image is decoded once as training decodes it: a bad file stops the run with its name,
or with --data.skip_bad_images is left out and listed in OUT/skipped_files.txt. The files' bytes are
stored as they are (no re-encode); `--max_side` stores larger images downscaled. The source is only
read; an output that is not empty is refused (a second run never mixes with the first), and a split
whose chunks do not hold every sample sent (a worker that died) stops the run before shards.json.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from jsonargparse import ArgumentParser

from project.atomic import atomic_write
from project.cli import parse_or_refuse
from project.config_checks import positive_int
from project.data import shards
from project.data.datamodule import ImageDataModule, default_num_workers
from project.data.decode import BadImageError
from project.data.index import ImageIndex
from project.data.shard_sample import Sample
from project.data.skipped import REPORT as SKIPPED
from project.data.skipped import SkipLog
from project.errors import UserError, exits_on_user_error

# Where LitData stages chunks before moving or uploading them (litdata/processing/data_processor.py)
STAGING = ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")


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
        exit_on_error=False,  # a refused command line is one error line (cli.parse_or_refuse)
        description="Write the data set as LitData shards per split (local folder or s3://) for "
        "`fit --data.root=OUT`: for data too many files or too remote for a folder loader.",
    )
    # the options that decide which images go into which split; the rest are for training
    layout = {
        "root",
        "val_split",
        "split_seed",
        "num_classes",
        "labels_csv",  # room: multilabel
        "label_delimiter",  # room: multilabel
        "skip_bad_images",
    }
    skip = set(inspect.signature(ImageDataModule.__init__).parameters) - layout - {"self"}
    p.add_class_arguments(ImageDataModule, "data", skip=skip)
    p.add_argument("--output", type=str, required=True, help="Folder or s3://bucket/prefix; must be empty.")
    p.add_argument("--max_side", type=int | None, default=None, help="Downscale longer sides above this.")
    p.add_argument("--workers", type=int | None, default=None, help="Processes; default one per core.")
    return p


def write_split(
    index: ImageIndex, url: str, max_side: int | None, workers: int, seed: int, skip_log: SkipLog | None
) -> shards.SplitRecord:
    """One split's images as shards at `url` (litdata.optimize), in a seeded random order; its counts.

    The ids stay the images' positions in the split; the chunks hold them shuffled.
    """
    labels = index.labels
    order = np.random.default_rng(seed).permutation(len(index))
    items = [
        (os.fsdecode(index.paths[i]), labels[i] if labels.ndim == 2 else int(labels[i]), int(i))
        for i in order
    ]
    print(f"{len(items)} images -> {url}", flush=True)
    # LitData sets the start method process-wide (force=True): put the caller's back afterwards, or
    # every later pool in this process (cleanlab's in `audit`, a notebook's own) would spawn too
    previous = multiprocessing.get_start_method(allow_none=True)
    try:
        shards.litdata().optimize(
            fn=Sample(index.root, max_side, skip_log),
            inputs=items,
            output_dir=url,
            chunk_bytes=shards.CHUNK_BYTES,
            num_workers=min(workers, len(items)),
            reorder_files=False,  # the seeded order above, not one by file size
            start_method="spawn",  # workers forked from a process with running threads can deadlock
        )
    except RuntimeError as e:  # LitData re-raises a worker's error with the worker's traceback as text
        raise worker_error(e, url) from None
    finally:
        multiprocessing.set_start_method(previous, force=True)
    if shards.is_url(url):
        shards.check_uploaded(url)
    skipped = skipped_positions(index, skip_log)
    kept = index.subset(np.setdiff1d(np.arange(len(index)), skipped))
    written = shards.written_count(url)
    if written != len(kept):
        raise UserError(
            f"optimize wrote {written} of the {len(kept)} samples of '{url}' (a worker stopped early: "
            "see its error above); no shards.json was written, so these shards are not used.",
            f"fix what the error names, then delete '{url.rsplit('/', 1)[0]}' and run optimize again.",
        )
    return shards.SplitRecord(len(kept), kept.class_counts(), len(skipped))


def worker_error(error: RuntimeError, url: str) -> UserError:
    """One line for a worker's error: a bad image's own message (with its fix), else the error's last line."""
    text = str(error)
    bad = re.search(rf"{BadImageError.__name__}: (?P<message>[^\n]*)", text)
    if bad is not None:
        return UserError(bad.group("message"))
    last = next((line for line in reversed(text.splitlines()) if line.strip()), text)
    return UserError(
        f"optimize stopped writing '{url}': {last.strip()}",
        "fix what it names, then run optimize again into an empty folder or prefix.",
    )


def skipped_positions(index: ImageIndex, skip_log: SkipLog | None) -> np.ndarray:
    """The positions in `index` of the files the workers skipped as bad (listed in `skip_log`)."""
    if skip_log is None or not any(skip_log.folder.glob(".skipped-*.part")):
        return np.array([], dtype=np.int64)
    report, _ = skip_log.merge()
    listed = {line.split(b"\t", 1)[0] for line in report.read_bytes().splitlines()}
    return np.array([i for i in range(len(index)) if bytes(index.paths[i]) in listed], dtype=np.int64)


@exits_on_user_error
def main(argv: list[str]) -> None:
    args = parse_or_refuse(parser(), argv)
    shards.litdata()  # without the extra, stop now: not after generating or indexing the images
    if args.max_side is not None:
        positive_int("max_side", args.max_side)
    workers = args.workers if args.workers is not None else default_num_workers()
    positive_int("workers", workers)
    out = str(args.output)
    data = ImageDataModule(**args.data.as_dict())
    if (
        args.data.root is not None
        and args.data.labels_csv is None  # room: multilabel
        and shards.has_index(args.data.root)
    ):
        raise UserError(
            f"--data.root '{args.data.root}' holds shards already: optimize reads image files.",
            "point --data.root at a folder of images"
            # room: multilabel begin
            " (or --data.labels_csv at a labels CSV)"
            # room: multilabel end
            ".",
        )
    if not shards.output_is_empty(out):
        raise UserError(
            f"--output '{out}' is not empty (shards of an earlier run, or other files).",
            "give a new folder or prefix (e.g. with a version suffix), or delete the old one first.",
        )
    if shards.is_url(out):
        shards.allow_plain_http()
    splits = data.splits  # the data module's layouts, checks and split rules
    summary: dict[str, shards.SplitRecord] = {}
    with private_staging(), tempfile.TemporaryDirectory(prefix="optimize-skipped-") as skipped:
        for name, index in splits.items():
            skip_log = SkipLog(Path(skipped) / name) if args.data.skip_bad_images else None
            url = shards.join(out, name)
            summary[name] = write_split(index, url, args.max_side, workers, args.data.split_seed, skip_log)
        report_skipped(out, Path(skipped))
    task = "multiclass"  # one class per sample
    task = data.task  # room: multilabel
    record = shards.ShardsRecord(
        task, tuple(splits["train"].class_names), summary, str(data.root.resolve()), args.max_side
    )
    shards.write_index(out, record)
    total = sum(s.count for s in summary.values())
    print(f"Wrote {total} images in {len(summary)} splits to {out}; train with --data.root={out}")


def report_skipped(out: str, folder: Path) -> None:
    """OUT/skipped_files.txt: `split/path<TAB>reason` of each file left out as bad, when there were any."""
    lines = [
        f"{report.parent.name}/".encode() + line
        for report in sorted(folder.glob(f"*/{SKIPPED}"))
        for line in report.read_bytes().splitlines()
    ]
    if not lines:
        return
    text = b"".join(line + b"\n" for line in lines)
    if shards.is_url(out):
        bucket, key = shards.bucket_key(shards.join(out, SKIPPED))
        shards.s3_client().put_object(Bucket=bucket, Key=key, Body=text)
    else:
        atomic_write(Path(out) / SKIPPED, text)
    print(f"Skipped {len(lines)} unreadable file(s), listed in {shards.join(out, SKIPPED)}", flush=True)
