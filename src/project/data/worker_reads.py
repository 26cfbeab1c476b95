"""Which file each DataLoader worker is reading, kept in shared memory for the main process to name.

A worker blocked in a read (a stuck network file system, a decoder that never returns) makes the
training loop wait for its batch forever. The loaders wait at most `--data.loader_timeout` seconds for a
batch (DataLoader's `timeout`); when that runs out, the main process reads this table and names the
worker and the file it was reading (`trainer.loader_stall_ends_in_one_line`).

One fixed-size slot per worker in a shared byte array (inherited by forked workers, passed to spawned
ones with the data set): a worker writes its slot before each file it opens, and nothing else.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from torch.utils.data import get_worker_info

SLOT = 1024  # bytes of a path kept per worker (a longer one is cut: it still names the file)


class WorkerReads:
    """The file each of `workers` loader workers opened last."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self.slots = multiprocessing.RawArray("c", self.workers * SLOT)

    def note(self, path: Path | str) -> None:
        """In a loader worker: `path` is the file it reads now (nothing in the main process)."""
        info = get_worker_info()
        if info is None or info.id >= self.workers:
            return
        start = info.id * SLOT
        self.slots[start : start + SLOT] = os.fsencode(path)[: SLOT - 1].ljust(SLOT, b"\0")

    def reading(self) -> dict[int, str]:
        """Worker id -> the file it opened last, for the workers that opened one."""
        found = {}
        for worker in range(self.workers):
            raw = bytes(self.slots[worker * SLOT : (worker + 1) * SLOT]).split(b"\0", 1)[0]
            if raw:
                found[worker] = os.fsdecode(raw)
        return found
