"""Cost of the debugging callbacks (data check, non-finite guard, gradient norms) per training step.

    python bench/debug_overhead.py [--backbone mobilenet_v3_small] [--image_size 64] [--steps 60]

Trains the same model on the same in-memory batches with and without the callbacks, alternating
the two 3 times in one process, and prints the median seconds per step of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from project.callbacks import DataCheck, GradNormMonitor, NonFiniteGuard
from project.model import ImageClassifier


class StepTimer(L.Callback):
    """Wall time of the training batches after the first few (warm-up excluded)."""

    def __init__(self, skip: int = 5) -> None:
        self.skip, self.times, self._start = skip, [], 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx >= self.skip:
            self.times.append(time.perf_counter() - self._start)


def seconds_per_step(args: argparse.Namespace, debug: bool) -> float:
    torch.manual_seed(0)
    images = torch.randint(
        0, 256, (args.steps * args.batch, 3, args.image_size, args.image_size), dtype=torch.uint8
    )
    loader = DataLoader(TensorDataset(images, torch.arange(len(images)) % 6), batch_size=args.batch)
    model = ImageClassifier(num_classes=6, backbone=args.backbone, scheduler=None)
    timer = StepTimer()
    callbacks = [timer, DataCheck(), NonFiniteGuard(), GradNormMonitor()] if debug else [timer]
    trainer = L.Trainer(
        max_epochs=1,
        logger=L.pytorch.loggers.CSVLogger(args.log_dir),
        log_every_n_steps=20,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(model, loader)
    return statistics.median(timer.times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbone", default="mobilenet_v3_small")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log_dir", default="/tmp/debug_overhead")
    args = parser.parse_args()
    plain, debug = [], []
    for _ in range(args.rounds):
        plain.append(seconds_per_step(args, debug=False))
        debug.append(seconds_per_step(args, debug=True))
    p, d = statistics.median(plain), statistics.median(debug)
    print(f"{args.backbone} {args.image_size}px batch {args.batch}, {torch.get_num_threads()} threads")
    print(f"without callbacks {p * 1000:.1f} ms/step, with {d * 1000:.1f} ms/step, ratio {p / d:.3f}")


if __name__ == "__main__":
    main()
