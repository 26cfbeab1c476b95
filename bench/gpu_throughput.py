"""Training images/s on one GPU: fp32 eager against configs/presets/gpu_fast.yaml, resnet50 at 224 px.

    python bench/gpu_throughput.py [--out results.json] [--batch 128] [--steps 60] [--photos 2000]
    python bench/gpu_throughput.py --smoke      # the same code on the CPU, tiny: checks the script

Four fits through lightning.Trainer and the project's ImageClassifier, in one process:
- synthetic: uint8 batches made once and served from memory (what the GPU alone can do);
- real: the project's ImageDataModule (default workers and augmentation) over photo-size JPEGs
  (500x375 to 1024x768) that this script writes into a temporary folder first;
each in fp32 eager (the template's defaults) and with the settings of the fragment (read from the
YAML). Images/s is timed after the warm-up steps, the device synchronized at both ends; the first
step (where compiling and cuDNN's algorithm search happen) is reported apart. "Data wait" is the
share of the timed wall time between the end of one training step and the start of the next:
the loop waiting for the loader. Prints a table and the fast/fp32 ratios, and writes them as JSON
to --out (default: $OUT/gpu_throughput.json when OUT is set). No network needed.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import yaml
from PIL import Image
from torch.utils.data import DataLoader, Subset, TensorDataset

from project.data.datamodule import ImageDataModule, default_num_workers
from project.model import ImageClassifier

GPU_FAST = Path(__file__).resolve().parents[1] / "configs" / "presets" / "gpu_fast.yaml"
# the fp32 eager side: the template's defaults for every key the fragment sets
FP32_EAGER = {
    "trainer": {"precision": "32-true", "benchmark": False},
    "model": {"channels_last": False, "compile": False},
    "data": {"prefetch_factor": None},
}
DISTINCT_BATCHES = 4  # synthetic: a few different batches, so no step sees the same memory twice in a row


@dataclass(frozen=True)
class Settings:
    backbone: str = "resnet50"
    image_size: int = 224
    batch: int = 128
    warmup: int = 10
    steps: int = 60
    photos: int = 2000
    classes: int = 10
    accelerator: str = "gpu"


SMOKE = Settings(
    backbone="resnet18", image_size=32, batch=8, warmup=2, steps=4, photos=48, classes=4, accelerator="cpu"
)


def fast_settings() -> dict[str, dict[str, Any]]:
    """The fragment's trainer, model and data keys; the fp32 side must name the same keys."""
    fragment = yaml.safe_load(GPU_FAST.read_text())
    keys = {section: set(values) for section, values in fragment.items()}
    if keys != {section: set(values) for section, values in FP32_EAGER.items()}:
        raise SystemExit(f"error: {GPU_FAST} sets {keys}: give FP32_EAGER in this script the same keys")
    return fragment


# ---- data ----


def write_photos(root: Path, count: int, classes: int) -> None:
    """`count` training JPEGs (and one validation JPEG per class) in class folders, on every core."""
    jobs = [(root / "train" / f"c{i % classes}" / f"{i:05d}.jpg", i) for i in range(count)]
    jobs += [(root / "val" / f"c{c}" / "val.jpg", count + c) for c in range(classes)]
    for path, _ in jobs:
        path.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor() as pool:
        list(pool.map(write_photo, jobs, chunksize=16))


def write_photo(job: tuple[Path, int]) -> None:
    """A 4:3 JPEG from 500x375 to 1024x768: smooth colour fields plus grain, so it decodes like a photo."""
    path, seed = job
    rng = np.random.default_rng(seed)
    width = int(rng.integers(500, 1025))
    height = width * 3 // 4
    coarse = Image.fromarray(rng.integers(0, 256, (9, 12, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float32)
    grain = rng.normal(0, 6, smooth.shape)
    Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8)).save(path, quality=90)


def synthetic_loader(s: Settings, pinned: bool) -> DataLoader:
    """Whole uint8 batches from memory (no decoding, no collating), pinned for the fast path."""
    generator = torch.Generator().manual_seed(0)
    shape = (DISTINCT_BATCHES, s.batch, 3, s.image_size, s.image_size)
    images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, s.classes, (DISTINCT_BATCHES, s.batch), generator=generator)
    if pinned:
        images, labels = images.pin_memory(), labels.pin_memory()
    order = [i % DISTINCT_BATCHES for i in range(s.warmup + s.steps)]
    return DataLoader(Subset(TensorDataset(images, labels), order), batch_size=None, pin_memory=pinned)


# ---- timing ----


class StepClock(L.Callback):
    """Times the steps after `warmup` (device synchronized at both ends) and the gaps between them."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.steps = 0
        self.first_step_s = self.warmup_s = self.timed_s = self.data_wait_s = 0.0
        self._train_start = self._step_start = self._step_end = self._timed_start = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._train_start = time.perf_counter()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self.steps >= self.warmup:  # the gap before a timed step: fetching and handing over its batch
            self.data_wait_s += now - self._step_end
        self._step_start = now

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.steps += 1
        if self.steps in (1, self.warmup, trainer.max_steps):
            synchronize(pl_module.device)  # the CPU runs ahead of the GPU: wait for the real end
            now = time.perf_counter()
            if self.steps == 1:
                self.first_step_s = now - self._step_start
            if self.steps == self.warmup:
                self.warmup_s, self._timed_start = now - self._train_start, now
            if self.steps == trainer.max_steps:
                self.timed_s = now - self._timed_start
        self._step_end = time.perf_counter()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- runs ----


def fit(s: Settings, mode: dict[str, dict[str, Any]], data: DataLoader | ImageDataModule) -> StepClock:
    """Train `s.warmup + s.steps` steps; validation, logging and checkpoints off."""
    L.seed_everything(0, verbose=False)
    model = ImageClassifier(
        num_classes=s.classes, image_size=s.image_size, backbone=s.backbone, **mode["model"]
    )
    clock = StepClock(s.warmup)
    trainer = L.Trainer(
        accelerator=s.accelerator,
        devices=1,
        max_steps=s.warmup + s.steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
        **mode["trainer"],
    )
    if isinstance(data, ImageDataModule):
        trainer.fit(model, datamodule=data)
    else:
        trainer.fit(model, train_dataloaders=data)
    return clock


def measure(s: Settings, source: str, name: str, mode: dict, photos: Path) -> dict[str, Any]:
    """One fit on `source` (synthetic or real) in mode `name` (fp32 or fast); its figures."""
    if source == "synthetic":
        pinned = name == "fast" and torch.cuda.is_available()
        data: DataLoader | ImageDataModule = synthetic_loader(s, pinned)
    else:
        data = ImageDataModule(root=str(photos), image_size=s.image_size, batch_size=s.batch, **mode["data"])
    clock = fit(s, mode, data)
    del data
    gc.collect()  # the last run's model, optimizer and loader workers go before the next run starts
    torch.cuda.empty_cache()
    return {
        "data": source,
        "mode": name,
        "images_per_s": s.steps * s.batch / clock.timed_s,
        "ms_per_step": 1000 * clock.timed_s / s.steps,
        "data_wait_share": clock.data_wait_s / clock.timed_s,
        "first_step_s": clock.first_step_s,
        "warmup_s": clock.warmup_s,
    }


def machine() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "cpu_cores": len(os.sched_getaffinity(0)),
        "loader_workers": default_num_workers(),
        "torch": torch.__version__,
        "lightning": L.__version__,
        "cuda": torch.version.cuda,
        # what "fp32" means on the GPU: cuDNN convolutions may use TF32, matmuls per this precision
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def ratios(runs: list[dict[str, Any]]) -> dict[str, float]:
    rate = {(r["data"], r["mode"]): r["images_per_s"] for r in runs}
    return {source: rate[source, "fast"] / rate[source, "fp32"] for source in ("synthetic", "real")}


def table(s: Settings, info: dict[str, Any], runs: list[dict[str, Any]], fast_over: dict) -> str:
    lines = [
        f"{s.backbone} {s.image_size} px, batch {s.batch}, {s.steps} timed steps after {s.warmup} of warm-up;"
        f" {info['device']}, {info['cpu_cores']} CPU cores, {info['loader_workers']} loader workers,"
        f" torch {info['torch']}, lightning {info['lightning']}",
        f"{'data':<10} {'mode':<5} {'images/s':>9} {'ms/step':>8} {'data wait':>9} "
        f"{'first step s':>12} {'warm-up s':>9}",
    ]
    for r in runs:
        lines.append(
            f"{r['data']:<10} {r['mode']:<5} {r['images_per_s']:>9.1f} {r['ms_per_step']:>8.1f} "
            f"{r['data_wait_share']:>9.1%} {r['first_step_s']:>12.2f} {r['warmup_s']:>9.2f}"
        )
    lines.append("fast / fp32 images/s: " + ", ".join(f"{k} {v:.2f}x" for k, v in fast_over.items()))
    return "\n".join(lines)


def parse_args() -> tuple[argparse.Namespace, Settings]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, a few steps, on the CPU")
    parser.add_argument("--out", default=None, help="JSON results (default: $OUT/gpu_throughput.json)")
    for key, value in asdict(Settings()).items():
        if key != "accelerator":
            parser.add_argument(f"--{key}", type=type(value), default=None, help=f"default {value}")
    args = parser.parse_args()
    base = SMOKE if args.smoke else Settings()
    chosen = {k: v for k, v in vars(args).items() if k in asdict(base) and v is not None}
    settings = Settings(**{**asdict(base), **chosen})
    if not args.smoke and not torch.cuda.is_available():
        parser.exit(
            2,
            "error: the GPU benchmark needs a CUDA device, and torch sees none. Run it on a GPU "
            "machine, or pass --smoke to run the same code on the CPU.\n",
        )
    if args.out is None and "OUT" in os.environ:
        args.out = str(Path(os.environ["OUT"]) / "gpu_throughput.json")
    return args, settings


def main() -> None:
    args, s = parse_args()
    started = time.perf_counter()
    modes = {"fp32": FP32_EAGER, "fast": fast_settings()}
    warnings.filterwarnings("ignore", ".*does not have many workers.*")  # synthetic batches are in memory
    logging.getLogger("lightning.pytorch").setLevel(
        logging.WARNING
    )  # four fits' banners would hide the table
    with tempfile.TemporaryDirectory(prefix="gpu_throughput-") as folder:
        write_photos(Path(folder), s.photos, s.classes)  # before CUDA starts: the pool forks
        generated = time.perf_counter() - started
        runs = [
            measure(s, source, name, mode, Path(folder))
            for source in ("synthetic", "real")
            for name, mode in modes.items()
        ]
    info, fast_over = machine(), ratios(runs)
    print(table(s, info, runs, fast_over))
    total = time.perf_counter() - started
    print(f"{s.photos} photos written in {generated:.1f} s; whole benchmark {total:.1f} s")
    if args.out:
        result = {
            "smoke": args.smoke,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "settings": asdict(s),
            "machine": info,
            "modes": modes,
            "runs": runs,
            "fast_over_fp32": fast_over,
            "photos_written_s": generated,
            "total_s": total,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
