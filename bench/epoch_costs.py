"""The fixed costs a fit pays every epoch, each timed inside a real `python -m project fit`.

    python bench/epoch_costs.py --root DATA [--epochs 4] [--sync_checkpoints] [fit flags...]

Runs fit in this process (resnet18 at 32 px, batch 64, 2 workers, export off, as
bench/handwritten.py) with timers wrapped around: the pictures (confusion matrix, misclassified
grid, training images: drawing and TensorBoard's PNG encoding), checkpoint saves (torch.save to
memory, then the atomic write: file write, fsync, rename, folder fsync) and TensorBoard's event
writing. Checkpoint writes run on a background thread: "checkpoint saves (all)" is the time
the training thread waits; `--sync_checkpoints` writes before the save returns, as before.
Prints each cost in seconds (total and per epoch) and as a share of the fit's wall time.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from project import atomic, checkpoint_io

# room: pictures begin
from project.callbacks.confusion_matrix import ConfusionMatrix
from project.callbacks.misclassified import Misclassified
from project.callbacks.training_images import TrainingImages

# room: pictures end
from project.cli import main as project_main

SECONDS: dict[str, float] = collections.defaultdict(float)
CALLS: dict[str, int] = collections.defaultdict(int)


def timed(owner: object, name: str, label: str) -> None:
    """Replace `owner.name` by a wrapper adding its wall time to SECONDS[label]."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - started
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def instrument() -> None:
    # room: pictures begin
    from torch.utils.tensorboard import SummaryWriter

    from project import figures

    timed(ConfusionMatrix, "on_validation_epoch_end", "pictures: confusion matrix (all)")
    timed(Misclassified, "on_validation_epoch_end", "pictures: misclassified grid (all)")
    timed(TrainingImages, "on_train_batch_start", "pictures: training images (all)")
    timed(figures, "to_rgb", "  of which matplotlib drawing (to_rgb)")
    timed(SummaryWriter, "add_image", "  of which TensorBoard add_image (PNG)")
    # room: pictures end
    timed(checkpoint_io.AtomicCheckpointIO, "save_checkpoint", "checkpoint saves (all)")
    timed(torch, "save", "  of which torch.save (to memory)")
    timed(atomic, "fsync_file", "  of which fsync of the file")
    timed(atomic, "fsync_dir", "  of which fsync of the folder")
    timed(checkpoint_io, "atomic_write", "  of which the atomic write (write+fsync+rename)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", required=True, help="image folder with train/ and val/")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument(
        "--sync_checkpoints", action="store_true", help="write checkpoints before save returns"
    )
    args, extra = parser.parse_known_args()
    instrument()
    if args.sync_checkpoints:  # the behaviour before background writes, for comparison
        checkpoint_io.AtomicCheckpointIO.__init__.__defaults__ = (False,)
    fit = ["fit", f"--data.root={Path(args.root).resolve()}", "--model.backbone=resnet18"]
    fit += ["--data.image_size=32", "--data.batch_size=64", "--data.num_workers=2"]
    fit += [
        f"--trainer.max_epochs={args.epochs}",
        "--export_best.enabled=false",
        "--trainer.enable_progress_bar=false",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            project_main(fit + extra)
        wall = time.perf_counter() - started
    print(
        f"fit (in-process, imports excluded): {wall:.1f} s, {args.epochs} epochs, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    for label, seconds in SECONDS.items():
        print(
            f"{label:<50} {seconds:6.2f} s  {seconds / args.epochs:5.2f} s/epoch  "
            f"{seconds / wall:6.1%}  ({CALLS[label]} calls)"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
