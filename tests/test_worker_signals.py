"""Loader workers (data/worker_signals.py) outlive a SIGTERM/SIGINT to the group; their parent stops them."""

from __future__ import annotations

import multiprocessing
import subprocess
import time
from multiprocessing.synchronize import Event
from pathlib import Path

from project.data.datamodule import ImageDataModule
from project.data.worker_signals import worker_init
from tests.helpers import workers_blocking_stop_signals


def idle_worker(ready: Event) -> None:
    worker_init(0)
    ready.set()
    time.sleep(60)


def test_a_worker_ignores_other_senders_and_ends_on_its_parents_sigterm() -> None:
    fork = multiprocessing.get_context("fork")
    ready = fork.Event()
    worker = fork.Process(target=idle_worker, args=(ready,), daemon=True)
    worker.start()
    assert ready.wait(30)
    for name in ("TERM", "INT"):  # as SLURM or `kill -- -PGID` (another process) sends them
        subprocess.run(["kill", f"-{name}", str(worker.pid)], check=True)
    time.sleep(0.5)
    assert worker.is_alive(), f"the worker died of another process's signal (exit {worker.exitcode})"
    worker.terminate()  # its parent's SIGTERM: the DataLoader's and multiprocessing's shutdown
    worker.join(5)
    assert worker.exitcode == 0  # as PyTorch's own handler exits: not reported as a failed worker


def test_the_folder_loaders_set_it_up_in_their_workers(shapes_root: Path) -> None:
    dm = ImageDataModule(root=str(shapes_root), image_size=24, batch_size=5, num_workers=2)
    dm.setup("fit")
    assert workers_blocking_stop_signals(dm.train_dataloader()) == [True, True]
