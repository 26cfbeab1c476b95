"""Do shards train as well as their folder? Class mix of the training batches and val/acc, in one run.

    python bench/shard_mix.py [--root data/shapes] [--epochs 2] [--batch_size 32]

Three arms over the same images (default: the embedded shapes, 4,800 training JPEGs in 6 classes,
generated on first use): the image folder; the shards `optimize` writes (each split in a seeded random
order); and the same samples written in class order, as `optimize` wrote them before (the baseline).
For each: the share of one epoch's training batches that hold a single class, the mean number of classes
per batch, and the val/acc of resnet18 at 32 px after --epochs epochs (the data module and the model of
`fit`, seed 0, no augmentation beyond fit's defaults). The CPU model is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from pathlib import Path

import numpy as np
import torch

from project.data import shards
from project.data.datamodule import ImageDataModule
from project.model import ImageClassifier
from project.optimize import main as optimize


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def in_class_order(source: Path, out: Path) -> None:
    """The shards at `source` rewritten with each split's samples sorted by label (the old layout)."""
    from litdata.streaming.writer import BinaryWriter

    from project.data.streaming import ShardSource

    found = ShardSource(str(source))
    for split in found.split_names:
        data = found.dataset(split, lambda image: image, False, 0, skip_bad_images=False)
        samples = sorted((data.read(i) for i in range(len(data))), key=lambda s: (s["label"], s["id"]))
        writer = BinaryWriter(str(out / split), chunk_bytes=shards.CHUNK_BYTES)
        for i, sample in enumerate(samples):
            writer[i] = {**sample, "image": bytes(sample["image"])}  # read as a view of the chunk
        writer.done()
        writer.merge(1)
    (out / shards.INDEX).write_bytes((source / shards.INDEX).read_bytes())


def module(root: Path, batch_size: int) -> ImageDataModule:
    return ImageDataModule(
        root=str(root),
        image_size=32,
        batch_size=batch_size,
        num_workers=2,
        cache=False,  # room: cache
    )


def class_mix(root: Path, batch_size: int) -> tuple[float, float]:
    data = module(root, batch_size)
    data.setup("fit")
    classes = [len(torch.unique(labels)) for _, labels in data.train_dataloader()]
    return sum(n == 1 for n in classes) / len(classes), float(np.mean(classes))


def val_acc(root: Path, batch_size: int, epochs: int) -> float:
    import lightning as L

    L.seed_everything(0, verbose=False)
    data = module(root, batch_size)
    model = ImageClassifier(
        num_classes=len(data.class_names), class_names=data.class_names, image_size=32, backbone="resnet18"
    )
    trainer = L.Trainer(
        max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(model, data)
    return float(trainer.callback_metrics["val/acc"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=None, help="image folder (default: the embedded shapes)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()
    root = args.root or ImageDataModule().root
    if args.root is None:
        ImageDataModule().source  # noqa: B018  generates the embedded shapes on first use
    with tempfile.TemporaryDirectory() as tmp:
        ordered, old = Path(tmp) / "shards", Path(tmp) / "class-order"
        optimize([f"--data.root={root}", f"--output={ordered}", f"--workers={os.cpu_count() or 1}"])
        in_class_order(ordered, old)
        print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); {root}, batch {args.batch_size}")
        arms = {"folder": root, "shards (seeded order)": ordered, "shards in class order (before)": old}
        for name, path in arms.items():
            share, mean = class_mix(path, args.batch_size)
            acc = val_acc(path, args.batch_size, args.epochs)
            print(
                f"{name:32s} single-class batches {share:6.1%}  classes/batch {mean:4.2f}  "
                f"val/acc after {args.epochs} epochs {acc:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
