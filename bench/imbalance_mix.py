"""Class imbalance (--data.balance) and MixUp/CutMix on CIFAR-10 subsets, arms alternating per seed.

    python bench/imbalance_mix.py imbalance --cifar /tmp/cifar/cifar10 [--seeds 0 1] [extra fit flags]
    python bench/imbalance_mix.py mix --cifar /tmp/cifar/cifar10 [--seeds 0 1] [extra fit flags]

`--cifar` is the extracted `../shared/datasets/cifar10-jpeg.tar.gz` (cifar10/{train,test}/<class>/).
Both studies link a few classes into a temporary train/val folder (val: CIFAR's test images) and train
configs/experiments/cifar10.yaml's resnet18 at 32 px for the same epochs in every arm.

- imbalance: one class (the minority) keeps a tenth of its training images; arms none, sampler and
  loss. Prints val/acc, val/balanced_acc, val/f1_macro and the minority class's recall (its accuracy).
- mix: balanced classes; arms off, mixup (alpha 0.2) and cutmix (alpha 1.0). Prints val/acc, the wall
  time of each run and the ratio of the arm's mean to the first arm's.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "experiments" / "cifar10.yaml"
ARMS = {
    "imbalance": {
        "none": ["--data.balance=none"],
        "sampler": ["--data.balance=sampler"],
        "loss": ["--data.balance=loss"],
    },
    "mix": {
        "off": [],
        "mixup": ["--data.mixup_alpha=0.2"],
        "cutmix": ["--data.cutmix_alpha=1.0"],
    },
}


def link_subset(
    cifar: Path, root: Path, classes: list[str], train: int, val: int, minority: str | None
) -> None:
    """root/{train,val}/<class>/ as symbolic links: `train` images per class (a tenth for the minority)."""
    for split, source, count in (("train", "train", train), ("val", "test", val)):
        for name in classes:
            keep = count // 10 if split == "train" and name == minority else count
            folder = root / split / name
            folder.mkdir(parents=True)
            for file in sorted((cifar / source / name).iterdir())[:keep]:
                (folder / file.name).symlink_to(file)


def fit(
    work: Path, root: Path, seed: int, flags: list[str], extra: list[str]
) -> tuple[dict[str, float], float]:
    """One run: the last validation's scalars and the wall time in seconds."""
    name = f"run{len(list((work / 'logs').glob('*'))) if (work / 'logs').is_dir() else 0}"
    command = [sys.executable, "-m", "project", "fit", f"--config={CONFIG}", f"--data.root={root}"]
    command += ["--data.val_split=null", f"--seed_everything={seed}", f"--name={name}"]
    command += ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    command += ["--export_best.enabled=false"]
    command += ["--misclassified.enabled=false", "--training_images.enabled=false"]  # room: pictures
    command += [*flags, *extra]
    start = time.perf_counter()
    subprocess.run(command, cwd=work, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    events = EventAccumulator(str(work / "logs" / name), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: events.Scalars(tag)[-1].value for tag in events.Tags()["scalars"]}, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study", choices=list(ARMS))
    parser.add_argument("--cifar", type=Path, required=True)
    parser.add_argument("--classes", default="airplane,automobile,bird,cat")
    parser.add_argument("--minority", default="cat")
    parser.add_argument("--train", type=int, default=500, help="training images per class")
    parser.add_argument("--val", type=int, default=300, help="validation images per class")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args, extra = parser.parse_known_args()
    classes = args.classes.split(",")
    minority = args.minority if args.study == "imbalance" else None
    extra = [f"--trainer.max_epochs={args.epochs}", "--model.scheduler.init_args.warmup_steps=20", *extra]
    results: dict[str, list[tuple[dict[str, float], float]]] = {arm: [] for arm in ARMS[args.study]}
    with tempfile.TemporaryDirectory() as tmp:
        work, root = Path(tmp) / "work", Path(tmp) / "data"
        work.mkdir()
        link_subset(args.cifar, root, classes, args.train, args.val, minority)
        for seed in args.seeds:  # arms alternate within each seed: load on the machine hits them alike
            for arm, flags in ARMS[args.study].items():
                scalars, seconds = fit(work, root, seed, flags, extra)
                results[arm].append((scalars, seconds))
                print(f"seed {seed} {arm:>8}: {row(scalars, minority)}, {seconds:.0f} s", flush=True)
    print(f"\nmean over seeds {args.seeds} ({len(classes)} classes, {args.epochs} epochs):")
    first = next(iter(results))
    base = statistics.mean(s["val/acc"] for s, _ in results[first])
    for arm, runs in results.items():
        mean = {tag: statistics.mean(s[tag] for s, _ in runs) for tag in runs[0][0]}
        seconds = statistics.mean(t for _, t in runs)
        print(f"{arm:>8}: {row(mean, minority)}, {seconds:.0f} s, val/acc x{mean['val/acc'] / base:.3f}")


def row(scalars: dict[str, float], minority: str | None) -> str:
    text = f"val/acc {scalars['val/acc']:.4f}, balanced {scalars['val/balanced_acc']:.4f}, "
    text += f"f1_macro {scalars['val/f1_macro']:.4f}"
    if minority is not None:  # room: pictures
        text += f", {minority} recall {scalars[f'val_class_acc/{minority}']:.4f}"  # room: pictures
    return text


if __name__ == "__main__":
    main()
