"""Training-loader images/s from shards (local and from a local S3 server) against the image folder.

    tar -xzf ../shared/datasets/cifar10-jpeg.tar.gz -C data cifar10/test    # 10,000 32x32 JPEGs
    python bench/shards.py [--root data/cifar10/test] [--epochs 2] [--workers 2]
    python bench/shards.py --upscale 224 --per_class 150 [--no_s3]    # 1,500 224x224 JPEGs

The folder is split with --data.val_split=0.1 (9,000 training images) and written by `optimize` to a
temporary folder and, through `python -m moto.server` started on 127.0.0.1, to a bucket; `optimize`'s
throughput is reported for both. Each loader is the data module's training loader (image_size 32,
RandomResizedCrop and flips, batch 128) iterated for --epochs epochs; the first epoch from the
bucket downloads the chunks into a fresh LITDATA_CACHE_DIR, later ones read that cache.
The image folder's loader decodes its files every epoch (--data.cache=false).  # room: cache
The machine's load average is printed with the figures: on a shared machine they move.

--upscale=S first writes --per_class images of each class of --root, resized to SxS (bicubic, JPEG
quality 90), to a temporary folder and measures that instead, with image_size S: the photo-sized case
(decoding and cropping cost grows with the pixels; reading a file costs the same per image).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from project.data.datamodule import ImageDataModule
from project.optimize import main as optimize

DATA = {
    "batch_size": 128,
    "cache": False,  # room: cache
    "split_seed": 0,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loader_rates(root: str, args: argparse.Namespace, **extra: object) -> list[float]:
    """Images per second of each epoch of the training loader."""
    size = args.upscale or 32
    dm = ImageDataModule(root=root, num_workers=args.workers, image_size=size, **DATA, **extra)
    dm.setup("fit")
    loader = dm.train_dataloader()
    rates = []
    for _ in range(args.epochs):
        started, images = time.perf_counter(), 0
        for images_batch, _labels in loader:
            images += len(images_batch)
        rates.append(images / (time.perf_counter() - started))
    return rates


def timed_optimize(root: str, output: str, workers: int) -> float:
    images = sum(1 for p in Path(root).rglob("*") if p.is_file())  # train + val: every image
    started = time.perf_counter()
    argv = [f"--data.root={root}", "--data.val_split=0.1", f"--output={output}", f"--workers={workers}"]
    optimize(argv)
    return images / (time.perf_counter() - started)


def upscaled(root: str, out: Path, side: int, per_class: int) -> str:
    """The first `per_class` images of each class folder of `root`, resized to side x side, as JPEGs."""
    from PIL import Image

    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        (out / folder.name).mkdir(parents=True)
        for path in sorted(folder.iterdir())[:per_class]:
            with Image.open(path) as image:
                big = image.convert("RGB").resize((side, side), Image.Resampling.BICUBIC)
            big.save(out / folder.name / path.name, quality=90)
    return str(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="data/cifar10/test")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--upscale", type=int, default=None, help="Measure SxS copies of --root's images.")
    parser.add_argument("--per_class", type=int, default=150, help="Images per class with --upscale.")
    parser.add_argument("--no_s3", action="store_true", help="Skip the bucket (local shards only).")
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            os.environ.update(
                AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                LITDATA_CACHE_DIR=str(Path(tmp) / "cache"),
            )  # fmt: skip
            time.sleep(3)  # the server's start
            from project.data.shards import s3_client

            s3_client().create_bucket(Bucket="bench")
            root = args.root
            if args.upscale:
                root = upscaled(root, Path(tmp) / "images", args.upscale, args.per_class)
            opt_local = timed_optimize(root, str(Path(tmp) / "shards"), args.workers)
            opt_s3 = None if args.no_s3 else timed_optimize(root, "s3://bench/cifar", args.workers)
            results["folder"] = loader_rates(root, args, val_split=0.1)
            results["shards, local"] = loader_rates(str(Path(tmp) / "shards"), args)
            if not args.no_s3:
                results["shards, S3 (127.0.0.1)"] = loader_rates("s3://bench/cifar", args)
        finally:
            server.terminate()
            server.wait()
    bucket = "" if opt_s3 is None else f", {opt_s3:.0f} images/s to the bucket"
    print(f"\noptimize: {opt_local:.0f} images/s to a local folder{bucket}")
    print(f"training loader, {args.workers} workers, images/s per epoch ({args.epochs} epochs):")
    for name, rates in results.items():
        print(f"  {name:24s} " + "  ".join(f"{r:7.0f}" for r in rates))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
