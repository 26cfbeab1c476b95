"""The dataset index at 1,000,000 files: build time, bytes per sample, and loader workers' memory.

    python bench/index_scale.py [--files 1000000] [--workers 2]

1. Builds the index (ImageIndex.from_listing, what scan_folder does after walking the folders)
   from a generated listing in ImageNet's naming (`n01440764/n01440764_10026.JPEG`, 1,000
   classes), and prints the time, the bytes per sample and the peak memory of the build.
2. Iterates one epoch of a DataLoader over it with `--workers` workers (decoding replaced by a
   constant image, so only the index is exercised) and samples each worker's private memory
   (USS: Private_Clean + Private_Dirty in /proc/PID/smaps_rollup) as the epoch goes. The same is
   done with a list of (path, label) tuples, the way torchvision's ImageFolder keeps `samples`:
   every read of a Python object writes its reference count, so forked workers copy the pages
   they read (copy-on-read) and their memory grows with the data set.
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from project.data.index import ImageIndex

IMAGE = torch.zeros(3, 8, 8, dtype=torch.uint8)


def listing(files: int) -> tuple[list[str], list[int], tuple[str, ...]]:
    rng = np.random.default_rng(0)
    classes = tuple(f"n{n:08d}" for n in sorted(rng.choice(10**8, 1000, replace=False)))
    paths = [f"{classes[i % 1000]}/{classes[i % 1000]}_{i // 1000 * 13 + 7}.JPEG" for i in range(files)]
    return paths, [i % 1000 for i in range(files)], classes


class IndexDataset(Dataset):
    """What ImageDataset does per sample, minus the decoding: the path and the label from the index."""

    def __init__(self, index: ImageIndex) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.index.path(i)
        return IMAGE, int(self.index.labels[i])


class TupleDataset(Dataset):
    """ImageFolder's way: a Python list of (path, label) tuples."""

    def __init__(self, samples: list[tuple[str, int]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[i]
        Path(path)
        return IMAGE, label


def uss_mib(pid: int) -> float:
    """Private memory of a process: what it does not share with its parent."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    return (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024


def worker_memory(dataset: Dataset, workers: int, points: int = 5) -> tuple[list[list[float]], float]:
    loader = DataLoader(dataset, batch_size=512, shuffle=True, num_workers=workers)
    iterator = iter(loader)
    pids = [w.pid for w in iterator._workers]  # the worker processes of this epoch
    every = max(1, len(loader) // points)
    samples: list[list[float]] = []
    started = time.perf_counter()
    for step, _ in enumerate(iterator):
        if step % every == 0 or step == len(loader) - 1:
            samples.append([uss_mib(pid) for pid in pids])
    return samples, time.perf_counter() - started


def show(name: str, samples: list[list[float]], seconds: float) -> None:
    print(f"\n{name}: epoch {seconds:.1f} s; private memory (USS) of each worker through the epoch, MiB")
    for k, values in enumerate(samples):
        print(f"  {k / (len(samples) - 1):4.0%}  " + "  ".join(f"{v:7.1f}" for v in values))
    growth = [end - start for start, end in zip(samples[0], samples[-1], strict=True)]
    print("  growth " + "  ".join(f"{g:+7.1f}" for g in growth))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    paths, labels, classes = listing(args.files)
    tracemalloc.start()
    started = time.perf_counter()
    index = ImageIndex.from_listing(Path("/data/imagenet/train"), paths, labels, classes)
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_sample = (index.paths.nbytes + index.labels.nbytes) / len(index)
    print(
        f"index of {len(index):,} files built in {seconds:.2f} s (peak {peak / 2**20:.0f} MiB building): "
        f"paths {index.paths.nbytes / 2**20:.1f} MiB ({index.paths.dtype}), labels "
        f"{index.labels.nbytes / 2**20:.1f} MiB -> {per_sample:.1f} bytes per sample"
    )
    samples = list(zip(paths, labels, strict=True))
    del paths, labels
    print(f"(main process: pid {os.getpid()}, USS {uss_mib(os.getpid()):.0f} MiB with both forms in memory)")
    show("template index (numpy arrays)", *worker_memory(IndexDataset(index), args.workers))
    show("list of (path, label) tuples", *worker_memory(TupleDataset(samples), args.workers))


if __name__ == "__main__":
    main()
