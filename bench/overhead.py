"""Framework overhead: the template's training step against a hand-written PyTorch loop.

    python bench/overhead.py [--steps 60] [--rounds 3]

The template is the real `python -m project fit` (default config: ImageClassifier, Lightning
Trainer, every default callback, TensorBoard logging, progress bar, checkpoints), run in this
process with its data loaders replaced by in-memory uint8 batches. The hand-written loop trains the
same torchvision network on the same batches: `model.train()`, `zero_grad`, forward (the same
uint8 -> float normalization), cross-entropy, `backward`, AdamW `step`, one loss `.item()` per
log interval. Same batch size and threads; the two alternate `--rounds` times. Step time is the
median over the steps after the first 5, measured from one step's start to the next.

Two models: the default (mobilenet_v3_small, 64 px) and a tiny one (shufflenet_v2_x0_5, 32 px,
batch 16), where a fixed per-step cost weighs most.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torchvision
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from project.cli import main as project_main
from project.data.datamodule import ImageDataModule
from project.data.shapes import generate_shapes
from project.model import ImageClassifier

MODELS = {"default": ("mobilenet_v3_small", 64, 32), "tiny": ("shufflenet_v2_x0_5", 32, 16)}
WARMUP = 5


def batches(steps: int, size: int, batch: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (steps * batch, 3, size, size), dtype=torch.uint8, generator=generator)
    return TensorDataset(images, torch.arange(len(images)) % 6)


def median_step(starts: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(starts[WARMUP:], starts[WARMUP + 1 :], strict=False))


class StepStarts(L.Callback):
    """Time stamps of every training step's start (and of the end of the last one)."""

    starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        StepStarts.starts.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == trainer.num_training_batches - 1:
            StepStarts.starts.append(time.perf_counter())


def template_step(data: TensorDataset, backbone: str, size: int, batch: int, work: Path) -> float:
    """`python -m project fit` with the default config; the loaders serve the in-memory batches."""
    ImageDataModule.setup = lambda self, stage: None
    ImageDataModule.train_dataloader = lambda self: DataLoader(data, batch_size=batch, shuffle=True)
    ImageDataModule.val_dataloader = lambda self: DataLoader(
        TensorDataset(data.tensors[0][:batch], data.tensors[1][:batch]), batch_size=batch
    )
    StepStarts.starts = []
    args = [
        "fit",
        f"--data.root={work / 'shapes'}",
        f"--data.image_size={size}",
        f"--data.batch_size={batch}",
        f"--model.backbone={backbone}",
        "--model.channels_last=false",  # the hand-written loop's memory format: overhead, not layout
        "--trainer.max_epochs=1",
        "--export_best.enabled=false",  # after training: not a step cost
        "--trainer.callbacks+=__main__.StepStarts",
    ]
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):  # drawn, not shown
        project_main(args)
    return median_step(StepStarts.starts)


def hand_written_step(data: TensorDataset, backbone: str, batch: int) -> float:
    """The loop people write: nothing but the step, on the same network and batches."""
    torch.manual_seed(0)
    model = torchvision.models.get_model(backbone, num_classes=6)
    normalize = ImageClassifier(num_classes=6, backbone=backbone, scheduler=None).normalize
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.002, weight_decay=0.05)
    model.train()
    starts = []
    for step, (images, labels) in enumerate(DataLoader(data, batch_size=batch, shuffle=True)):
        starts.append(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(normalize(images)), labels)
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            loss.item()
    starts.append(time.perf_counter())
    return median_step(starts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())  # the same for both: the default, one per core
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        generate_shapes(work / "shapes", 2, 1, image_size=32)  # class names for the CLI; not trained on
        os.chdir(work)  # logs/ and checkpoints/ of the template's runs
        for name, (backbone, size, batch) in MODELS.items():
            data = batches(args.steps, size, batch)
            times: dict[str, list[float]] = {"template": [], "hand-written": []}
            for _ in range(args.rounds):
                times["template"].append(template_step(data, backbone, size, batch, work))
                times["hand-written"].append(hand_written_step(data, backbone, batch))
            ours, theirs = (statistics.median(times[k]) for k in ("template", "hand-written"))
            print(
                f"{name} ({backbone}, {size} px, batch {batch}, {torch.get_num_threads()} threads): "
                f"template {ours * 1e3:.1f} ms/step, hand-written {theirs * 1e3:.1f} ms/step, "
                f"throughput ratio (template / hand-written) {theirs / ours:.3f}",
                file=sys.stdout,
                flush=True,
            )


if __name__ == "__main__":
    main()
