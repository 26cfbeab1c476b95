"""Training recipes measured on CIFAR-10 JPEGs, one a command (`python bench/recipes.py RECIPE --help`).

    python bench/recipes.py warmup --cifar /tmp/cifar/cifar10 [--seeds 2]

The arms alternate (seed by seed), each a `python -m project fit` in an empty folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.data.datamodule import ImageDataModule
from project.model import ImageClassifier

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "experiments" / "cifar10.yaml"


def subset(cifar: Path, target: Path, classes: list[str], train: int, val: int) -> Path:
    """`target/{train,val}/<class>/`: the first training images, `train` in all (split evenly among the
    classes), and the first `val` test images of each class."""
    for split, source, total in (("train", "train", train), ("val", "test", val * len(classes))):
        for i, name in enumerate(classes):
            count = total // len(classes) + (i < total % len(classes))
            folder = target / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for path in sorted((cifar / source / name).glob("*.jpg"))[:count]:
                shutil.copyfile(path, folder / path.name)
    return target


def fit(flags: list[str], src: Path | None = None) -> tuple[list[float], Path, float]:
    """Run fit in an empty folder, with the project from `src` if given; (val/acc by epoch, last
    checkpoint, seconds)."""
    work = Path(tempfile.mkdtemp(prefix="recipes-"))
    env = (
        {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"} if src else None
    )
    command = [sys.executable, "-m", "project", "fit", "--trainer.enable_progress_bar=false"]
    command += ["--export_best.enabled=false", "--name=run", *flags]
    start = time.perf_counter()
    subprocess.run(
        command, cwd=work, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    seconds = time.perf_counter() - start
    events = EventAccumulator(str(work / "logs" / "run"))
    events.Reload()
    return [e.value for e in events.Scalars("val/acc")], work / "checkpoints" / "run" / "last.ckpt", seconds


def answer_spread(checkpoint: Path, root: Path) -> float:
    """The standard deviation over the validation images of P(second class): 0 when every image gets
    the same answer."""
    model = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    data = ImageDataModule(root=str(root), image_size=model.image_size, batch_size=100, num_workers=0)
    data.setup("validate")
    with torch.no_grad():
        probs = torch.cat([model(images).softmax(1)[:, 1] for images, _ in data.val_dataloader()])
    return float(probs.std())


def warmup(cifar: Path, seeds: int, before: Path | None) -> None:
    """A short run's warm-up: the short run of a small folder (245 training images of 2 classes, 100
    validation images each, the default model and schedule, batch 32, 2 epochs = 14 optimizer steps): the
    template as it is (warm-up at most 10% of the run, BatchNorm statistics from the batches seen), the
    same with the fixed 50-step warm-up (`max_warmup_fraction` large), and with `--before-src OLD/src`
    an older checkout's code. Prints each arm's val/acc and how much the model's answer varies between
    images (the std of P(second class); 0 when every image gets the same answer)."""
    root = subset(cifar, Path(tempfile.mkdtemp(prefix="recipes-small-")), ["cat", "ship"], 245, 100)
    arms: dict[str, tuple[list[str], Path | None]] = {
        "now": ([], None),
        "now, fixed 50-step warm-up": (["--model.scheduler.init_args.max_warmup_fraction=1000"], None),
    }
    if before:
        arms = {"before (--before-src)": ([], before), **arms}
    results: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    for seed in range(seeds):
        for arm, (extra, src) in arms.items():
            flags = [f"--data.root={root}", "--trainer.max_epochs=2", f"--seed_everything={seed}"]
            accuracy, last, seconds = fit([*flags, "--data.num_workers=0", *extra], src)
            results[arm].append((accuracy[-1], answer_spread(last, root)))
            print(
                f"seed {seed} {arm}: val/acc {accuracy[-1]:.4f}, std of P {results[arm][-1][1]:.4f}, "
                f"{seconds:.0f} s",
                flush=True,
            )
    for arm, rows in results.items():
        acc, spread = (statistics.mean(r[i] for r in rows) for i in (0, 1))
        print(f"{arm}: mean val/acc {acc:.4f}, mean std of P(ship) {spread:.4f}")


# room: ema begin
def ema(cifar: Path, seeds: int, budget: str) -> None:
    """EMA of the weights: resnet18 from scratch on a CIFAR-10 subset (500 training images a class, 100
    validation) under one time budget (`--trainer.max_time`), without and with `--ema.decay=0.999`.
    Prints the last and best val/acc of each arm and the difference."""
    classes = sorted(p.name for p in (cifar / "train").iterdir())
    root = subset(cifar, Path(tempfile.mkdtemp(prefix="recipes-cifar-")), classes, 5000, 100)
    arms = {"no EMA": [], "EMA 0.999": ["--ema.decay=0.999"]}
    results: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    for seed in range(seeds):
        for arm, extra in arms.items():
            flags = [
                "--config", str(CONFIG), f"--data.root={root}", "--data.val_split=null",
                "--data.batch_size=64", "--data.num_workers=1", "--trainer.max_epochs=1000",
                f"--trainer.max_time={budget}", f"--seed_everything={seed}", *extra,
            ]  # fmt: skip
            accuracy, _, seconds = fit(flags)
            results[arm].append((accuracy[-1], max(accuracy)))
            print(
                f"seed {seed} {arm}: {len(accuracy)} epochs, val/acc last {accuracy[-1]:.4f}, "
                f"best {max(accuracy):.4f}, {seconds:.0f} s",
                flush=True,
            )
    means = {arm: [statistics.mean(r[i] for r in rows) for i in (0, 1)] for arm, rows in results.items()}
    for arm, (last, best) in means.items():
        print(f"{arm}: mean val/acc last {last:.4f}, best {best:.4f}")
    (base_last, base_best), (ema_last, ema_best) = means.values()
    print(f"EMA minus none: last {ema_last - base_last:+.4f}, best {ema_best - base_best:+.4f}")


# room: ema end
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common = argparse.ArgumentParser(add_help=False)  # the options of every recipe
    common.add_argument("--cifar", type=Path, required=True, help="cifar10/ with train/ and test/")
    common.add_argument("--seeds", type=int, default=2)
    recipes = parser.add_subparsers(dest="recipe", required=True)
    recipe = recipes.add_parser("warmup", parents=[common], description=warmup.__doc__)
    recipe.add_argument("--before-src", type=Path, help="also run the project from this src/ folder")
    recipe.set_defaults(run=lambda args: warmup(args.cifar, args.seeds, args.before_src))
    # room: ema begin
    recipe = recipes.add_parser("ema", parents=[common], description=ema.__doc__)
    recipe.add_argument("--budget", default="00:00:03:00", help="each arm's --trainer.max_time")
    recipe.set_defaults(run=lambda args: ema(args.cifar, args.seeds, args.budget))
    # room: ema end
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
