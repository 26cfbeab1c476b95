"""Train-loader epoch time on the CIFAR-10 JPEGs: decoded every epoch, cached, cached + batch augmentation.

    tar -xzf ../shared/datasets/cifar10-jpeg.tar.gz -C data     # once: data/cifar10/{train,test}
    python bench/cache_epoch.py [--root data/cifar10/train] [--epochs 3] [--workers 2]

The data options (image size, crops, augmentation, batch size) are those of
configs/experiments/cifar10.yaml; `--auto_augment none` measures crops and flips only. Each
loader is iterated for `--epochs` epochs with persistent workers; the first epoch (worker start,
and for the cache nothing else: it was filled at setup, timed separately) is reported apart, and
the ratios are of the medians of the later epochs. Three loaders alternate epoch by epoch:
`uncached` (`--data.cache=false`), `per-image` (cached, torchvision's transforms one image at a
time: `--data.batch_augment=false`) and `batched` (cached, data/batch_augment.py: the default).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

from project.data.datamodule import ImageDataModule

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "experiments" / "cifar10.yaml"


SIDES = {"uncached": (False, False), "per-image": (True, False), "batched": (True, True)}


def datamodule(args: argparse.Namespace, side: str) -> ImageDataModule:
    cache, batch_augment = SIDES[side]
    options = yaml.safe_load(CONFIG.read_text())["data"]
    options.update(root=args.root, num_workers=args.workers, cache=cache, batch_augment=batch_augment)
    if args.auto_augment is not None:
        options["auto_augment"] = args.auto_augment
    dm = ImageDataModule(**options)
    started = time.perf_counter()
    dm.setup("fit")
    print(f"setup ({side}): {time.perf_counter() - started:.1f} s")
    return dm


def epoch_seconds(loader: torch.utils.data.DataLoader) -> float:
    started = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="data/cifar10/train")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--auto_augment", choices=["none", "trivialaugment", "randaugment"], default=None)
    args = parser.parse_args()
    if not Path(args.root).is_dir():
        sys.exit(
            f"error: '{args.root}' is missing. Fix: tar -xzf ../shared/datasets/cifar10-jpeg.tar.gz -C data"
        )
    torch.manual_seed(0)
    loaders = {name: datamodule(args, name).train_dataloader() for name in SIDES}
    times: dict[str, list[float]] = {name: [] for name in loaders}
    for epoch in range(args.epochs):
        for name, loader in loaders.items():
            times[name].append(epoch_seconds(loader))
            print(f"epoch {epoch} {name:8s} {times[name][-1]:6.2f} s")
    later = {name: statistics.median(t[1:]) for name, t in times.items()}
    n = len(loaders["uncached"].dataset)
    for name, seconds in later.items():
        print(
            f"{name:8s} first epoch {times[name][0]:6.2f} s, "
            f"later epochs {seconds:6.2f} s ({n / seconds:,.0f} img/s)"
        )
    for name in ("per-image", "batched"):
        print(f"uncached / {name} (epochs after the first): {later['uncached'] / later[name]:.2f}x")
    print(f"per-image / batched (epochs after the first): {later['per-image'] / later['batched']:.2f}x")


if __name__ == "__main__":
    main()
