"""Functions the tests share: flags for a fast fit, an in-process CLI runner, tiny data and trainers.

Fixtures stay in tests/conftest.py; these are plain functions and classes, imported by name.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, TensorDataset

from project.cli import ProjectCLI, main
from project.data.shapes import CLASSES
from project.trainer import Trainer

# Training, `validate`, `test` and `predict` decode with torchvision (JPEG) or Pillow and resize uint8
# tensors with torchvision; `infer` and `serve` must stay torch-free, so they decode and resize with
# Pillow only. The two paths may differ by a level or two on some pixels: libjpeg-turbo's IDCT and
# chroma upsampling as torchvision and Pillow call it, and the rounding of the antialiased bilinear
# resize. Measured on the consistency models and images: at most 1e-4 (docs/consistency.md); JPEG photographs
# reach about 1e-3. A wrong step (16-bit values clipped instead of scaled, a missed EXIF rotation,
# alpha or palette handled differently, another resize) moves probabilities by 1e-2 or more.
DECODER_BOUND = 2e-3
REPO = Path(__file__).resolve().parents[1]  # the checkout under test


def fast_args(root: Path, *extra: str) -> list[str]:
    """Flags for a fit that takes a few seconds on CPU."""
    return [
        f"--data.root={root}",
        "--data.image_size=32",
        "--data.batch_size=16",
        "--data.num_workers=0",
        "--model.backbone=resnet18",
        "--model.scheduler.init_args.warmup_steps=1",
        "--trainer.max_epochs=1",
        "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--export_best.enabled=false",
        *extra,
    ]


def run_cli(*args: str) -> int:
    """Run `python -m project ARGS` in this process; returns the exit status."""
    return exit_status(main, *args)


def exit_status(entry: Callable[[list[str]], object], *args: str) -> int:
    """Run a command's `main(argv)` in this process; returns its exit status."""
    saved, sys.argv = sys.argv, ["project"]  # pytest's own flags are not ours
    try:
        entry(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        sys.argv = saved
    return 0


def built_as_fit(*args: str) -> ProjectCLI:
    """The CLI of `fit ARGS` with its model and data module built as fit builds them (defaults, links, the
    backbone's data settings), without training: Trainer.fit does nothing; a fast_dev_run claims no run."""

    @functools.wraps(Trainer.fit)  # the CLI reads fit's signature for its flags
    def parsed_only(*_: object, **__: object) -> None:
        return None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "fit", parsed_only)
        return ProjectCLI(args=["fit", *args, "--trainer.fast_dev_run=true"])


# one colour per class: learnt within the 6 optimizer steps of a 2-epoch fit of fast_args, where the shapes
# stay near chance and calibration is refused (it would flatten the model)
PALETTE = [(220, 40, 40), (40, 200, 40), (40, 40, 220), (230, 230, 40), (200, 40, 200), (40, 210, 210)]


def coloured(colour: tuple[int, int, int], rng: np.random.Generator, size: int = 32) -> Image.Image:
    """A square image of `colour` with noise: an image of that colour's class."""
    pixels = np.clip(np.array(colour) + rng.normal(0, 25, (size, size, 3)), 0, 255)
    return Image.fromarray(pixels.astype(np.uint8))


def write_colours(root: Path) -> Path:
    """train/ and val/ of the shapes' 6 class names, 8 + 4 noisy 32x32 PNGs each, told apart by colour."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 8), ("val", 4)):
        for colour, name in zip(PALETTE, CLASSES, strict=True):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                coloured(colour, rng).save(root / split / name / f"{i}.png")
    return root


def write_image(path: Path, mode: str = "RGB", size: tuple[int, int] = (20, 12), **save: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size).save(path, **save)
    return path


class TensorData(L.LightningDataModule):
    """In-memory (images, labels) batches, in order: for injecting faults into exact positions."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 8) -> None:
        super().__init__()
        self.data = TensorDataset(images, labels)
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size)


def tiny_trainer(*callbacks: L.Callback, **kwargs: object) -> L.Trainer:
    """A CPU trainer without logs, checkpoints or progress bar."""
    options = {
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "accelerator": "cpu",
        **kwargs,
    }
    return L.Trainer(callbacks=list(callbacks), **options)


def workers_blocking_stop_signals(loader: DataLoader) -> list[bool]:
    """For each worker `loader` starts: whether it blocks SIGTERM and SIGINT (read from /proc)."""
    import multiprocessing

    before = set(multiprocessing.active_children())
    batches = iter(loader)
    for _ in range(loader.num_workers):  # batch i comes from worker i: each is past its worker_init_fn
        next(batches)
    found = []
    for worker in set(multiprocessing.active_children()) - before:
        status = Path(f"/proc/{worker.pid}/status").read_text()
        mask = int(status.split("SigBlk:")[1].split()[0], 16)
        found.append(all(mask >> (signum - 1) & 1 for signum in (signal.SIGTERM, signal.SIGINT)))
    del batches
    return found


class RunsCode:
    """Unpickling this calls os.system: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def write_deflated(state: dict, path: Path) -> Path:
    """torch.save's archive of `state` with its entries rewritten deflated: a file far smaller than the
    data it declares, each entry of which torch.load would allocate in full."""
    plain = path.with_name(f"{path.name}.plain")
    torch.save(state, plain)
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for entry in source.infolist():
            out.writestr(entry.filename, source.read(entry))
    plain.unlink()
    return path


def scalar_tags(log_dir: Path) -> set[str]:
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return set(events.Tags()["scalars"])


MiB = 2**20


def budget_of(output: str) -> dict[str, float]:
    """MiB per row of the printed table."""
    rows = re.findall(r"^  (\S.*?)\s+([\d.]+) MiB", output, flags=re.MULTILINE)
    return {name.strip(): float(size) for name, size in rows}


# the DDP preset on CPU processes (gloo): `run_module(tmp, "fit", *DDP, ...)` runs two ranks
DDP = [
    "--config",
    str(REPO / "configs" / "presets" / "ddp.yaml"),
    "--trainer.accelerator=cpu",
]


def run_module(cwd: Path, *args: str, launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """`python -m project ARGS` (or under a launcher) in a subprocess, as a user would run it."""
    command = [*(launcher or [sys.executable]), "-m", "project", *args]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


# the page tests (serve's page, the report's HTML) drive Debian's Chromium with these flags
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
