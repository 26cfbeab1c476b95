"""Shards at scale: index size, first-batch latency and loader-worker peak memory against sample count.

    python bench/shards_scale.py [--counts 10000 1000000] [--batches 50] [--workers 2]

For each count, a synthetic data set of that many 8x8 JPEGs (64 distinct images drawn once, sample i
uses image i % 64 and label i % 10: generating the pixels is not what is measured) is written with
`litdata.optimize` straight from memory, in the sample layout `optimize` writes, with a shards.json, so
the data module reads it as any shards folder. Then, in a fresh process per count, the data module's
training loader (image_size 8, batch 128, 2 workers, shuffled) is started and read for --batches
batches: the first batch's latency (loader start included), the peak resident memory (VmHWM) of
each loader worker and its Private_Dirty (what it wrote itself, not pages shared with the parent
after the fork), read from /proc while the workers are alive. Printed: write time, the size of
LitData's index.json and of all chunks, the latency, the workers' memory, the load average.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from project.data import shards
from project.optimize import private_staging

DISTINCT = 64


def tiny_jpegs() -> list[bytes]:
    """DISTINCT different 8x8 JPEGs (flat colours)."""
    from PIL import Image

    out = []
    for i in range(DISTINCT):
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (i * 4, 255 - i * 4, (i * 37) % 256)).save(buffer, format="JPEG")
        out.append(buffer.getvalue())
    return out


class Sample:
    """Sample i in optimize's layout (image bytes, label, id, path): picklable for LitData's workers."""

    def __init__(self) -> None:
        self.images = tiny_jpegs()

    def __call__(self, i: int) -> dict[str, object]:
        return {"image": self.images[i % DISTINCT], "label": i % 10, "id": i, "path": f"synthetic/{i}.jpg"}


def write(out: Path, count: int, workers: int) -> float:
    """The synthetic shards of `count` training samples (and 1,000 validation ones); seconds taken."""
    started = time.perf_counter()
    for split, n in (("train", count), ("val", 1000)):
        shards.litdata().optimize(
            fn=Sample(), inputs=list(range(n)), output_dir=str(out / split), chunk_bytes="64MB",
            num_workers=workers, reorder_files=False, start_method="fork",
        )  # fmt: skip
    elapsed = time.perf_counter() - started
    classes = [str(c) for c in range(10)]
    counts = {
        name: {"count": n, "class_counts": [n // 10] * 10} for name, n in (("train", count), ("val", 1000))
    }
    shards.write_index(
        out,
        {"format": shards.FORMAT, "task": "multiclass", "class_names": classes, "splits": counts,
         "source": "synthetic", "max_side": None},
    )  # fmt: skip
    return elapsed


def private_dirty_kib(pid: int) -> int:
    """Memory the process wrote itself (not shared with its parent, not file pages): its own growth."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])
    return 0


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def measure(root: str, batches: int, workers: int) -> dict[str, object]:
    """In this process: first-batch latency and worker peak RSS of the training loader."""
    from project.data.datamodule import ImageDataModule

    dm = ImageDataModule(
        root=root,
        num_workers=workers,
        image_size=8,
        batch_size=128,
        cache=False,  # room: cache
    )
    dm.setup("fit")
    started = time.perf_counter()
    iterator = iter(dm.train_dataloader())
    next(iterator)
    first = time.perf_counter() - started
    for _ in range(batches - 1):
        next(iterator)
    # the loader's workers: this process's children, alive while the iterator is
    pids = [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and parent_of(int(p.name)) == os.getpid()
    ]
    return {
        "first_batch_s": first,
        "after_s": time.perf_counter() - started,
        "worker_peak_rss_mib": [peak_rss_kib(p) / 1024 for p in pids],
        "worker_private_dirty_mib": [private_dirty_kib(p) / 1024 for p in pids],
        "main_peak_rss_mib": peak_rss_kib(os.getpid()) / 1024,
    }


def parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.batches, args.workers)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for count in args.counts:
            out = Path(tmp) / f"n{count}"
            with private_staging():
                seconds = write(out, count, args.workers)
            child = [sys.executable, __file__, "--measure", str(out), "--batches", str(args.batches)]
            child += ["--workers", str(args.workers)]
            result = json.loads(
                subprocess.run(child, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
            )
            rows.append(
                (count, seconds, (out / "train" / "index.json").stat().st_size, size(out / "train"), result)
            )
            print(count, rows[-1][1:], flush=True)
    print(f"\ntraining loader, {args.workers} workers, batch 128, first {args.batches} batches:")
    print("  samples  write s  index.json  chunks  first batch s  worker peak RSS MiB  private MiB  main MiB")
    for count, seconds, index_bytes, total, r in rows:
        workers = " ".join(f"{m:.0f}" for m in r["worker_peak_rss_mib"])
        private = " ".join(f"{m:.1f}" for m in r["worker_private_dirty_mib"])
        print(
            f"  {count:>9,}  {seconds:6.1f}  {index_bytes / 1024:7.1f} KiB  {total / 2**20:6.1f} MiB"
            f"  {r['first_batch_s']:6.2f}  {workers:>12s}  {private:>10s}  {r['main_peak_rss_mib']:.0f}"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
