"""Small-data transfer: fine-tune local pretrained weights on a small folder, with and without each recipe.

    python bench/transfer.py --cifar /tmp/cifar10 [--work DIR] [--per-class 50] [--epochs 30] [--seeds 3]
                             [--backbone resnet18 | timm/resnet18 | ...]

Offline stand-in for "fine-tune ImageNet weights on my 50 photos a class": resnet18 (or `--backbone`,
e.g. a timm model) is trained at
32 px on five CIFAR-10 classes (airplane, automobile, bird, cat, deer; `--pretrain-epochs`), its
backbone saved as a local state-dict file (head left out), then fine-tuned on the five other
classes (dog, frog, horse, ship, truck) with `--per-class` training images each, validated on 200
test images a class. Arms, alternated seed by seed, same epochs and learning rate:

    scratch     no weights
    full        the local weights, every layer trained from the first step
    schedule    the local weights, --model.head_epochs=E/4 --model.layer_decay=0.7  # room: finetune

# room: recipes begin
and test-time augmentation (`--model.tta=flip`) on/off, on each pretrained arm's last checkpoint.
# room: recipes end
Prints per-seed rows (validation accuracy at the end, wall time), the means and the ratios to `full`.
`cifar` is the folder holding train/<class>/*.jpg and test/<class>/*.jpg
(tar -xzf cifar10-jpeg.tar.gz gives cifar10/).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from project.backbones import build_backbone, head_of

SOURCE = ("airplane", "automobile", "bird", "cat", "deer")
TARGET = ("dog", "frog", "horse", "ship", "truck")
VAL_PER_CLASS = 200
ARMS = ("scratch", "full")  # the default --arms, in this order
ARMS = (*ARMS, "schedule")  # room: finetune


def link_subset(src: Path, dst: Path, classes: tuple[str, ...], count: int | None) -> None:
    for name in classes:
        (dst / name).mkdir(parents=True, exist_ok=True)
        for file in sorted((src / name).iterdir())[:count]:
            target = dst / name / file.name
            if not target.exists():
                os.link(file, target)


def run(command: list[str], cwd: Path) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), ""])}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr, seconds


def project(*args: str) -> list[str]:
    return [sys.executable, "-m", "project", *args]


COMMON = (
    "--data.image_size=32",
    "--data.crop_ratio=1.0",
    "--data.num_workers=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--export_best.enabled=false",
    "--training_images.enabled=false",  # room: pictures
    "--misclassified.enabled=false",  # room: pictures
    "--confusion_matrix.enabled=false",  # room: pictures
)


def pretrain(work: Path, cifar: Path, epochs: int, backbone: str = "resnet18") -> Path:
    """`backbone` on the five source classes; its weights (no head) saved as `pretrained-<backbone>.pth`."""
    slug = backbone.replace("/", "-")
    weights = work / f"pretrained-{slug}.pth"
    if weights.is_file():
        return weights
    source = work / "source"
    link_subset(cifar / "train", source, SOURCE, None)
    name = f"pretrain-{slug}"
    _, seconds = run(
        project(
            "fit",
            "--config=configs/experiments/cifar10.yaml",
            f"--data.root={source.resolve()}",
            f"--trainer.max_epochs={epochs}",
            f"--model.backbone={backbone}",
            "--model.scheduler.init_args.warmup_steps=100",
            f"--name={name}",
            *COMMON,
        ),
        work,
    )
    last = work / "checkpoints" / name / "last.ckpt"
    state = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    net = build_backbone(backbone, len(SOURCE))
    head = next(f"net.{name}." for name, module in net.named_modules() if module is head_of(net))
    kept = {
        k.removeprefix("net."): v for k, v in state.items() if k.startswith("net.") and not k.startswith(head)
    }
    torch.save(kept, weights)
    print(f"pretrained {epochs} epochs in {seconds:.0f} s -> {weights}", flush=True)
    return weights


def accuracy(output: str, key: str = "val/acc") -> float:
    found = re.findall(rf"{re.escape(key)}\s*[│|]?\s*([0-9.]+)", output)
    return float(found[-1])


def arm(
    work: Path, name: str, seed: int, epochs: int, lr: float, extra: list[str], backbone: str = "resnet18"
) -> tuple[float, float]:
    _, seconds = run(
        project(
            "fit",
            f"--data.root={(work / 'target').resolve()}",
            "--data.batch_size=32",
            "--data.auto_augment=trivialaugment",
            "--data.scale=[0.35,1.0]",
            f"--model.backbone={backbone}",
            "--model.bn_momentum=0.1",
            f"--model.optimizer.init_args.lr={lr}",
            "--model.optimizer.init_args.weight_decay=0.05",
            "--model.scheduler.init_args.warmup_steps=20",
            f"--trainer.max_epochs={epochs}",
            f"--trainer.check_val_every_n_epoch={epochs}",
            f"--seed_everything={seed}",
            f"--name={name}",
            *COMMON,
            *extra,
        ),
        work,
    )
    return validate(work, name, []), seconds


def validate(work: Path, name: str, extra: list[str]) -> float:
    ckpt = work / "checkpoints" / name / "last.ckpt"
    out, _ = run(project("validate", f"--ckpt_path={ckpt}", "--data.num_workers=2", *extra), work)
    return accuracy(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cifar", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/transfer-bench"))
    parser.add_argument("--per-class", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--pretrain-epochs", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--pretrain-only", action="store_true")
    parser.add_argument("--backbone", default="resnet18", help="any --model.backbone (timm/resnet18, ...)")
    parser.add_argument("--arms", default=",".join(ARMS), help="which arms to run")
    # room: finetune begin
    parser.add_argument(
        "--schedule-epochs", type=int, help="epochs of the schedule arm (its head-only epochs are cheaper)"
    )
    # room: finetune end
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(Path(__file__).parents[1] / "configs", work / "configs", dirs_exist_ok=True)
    weights = pretrain(work, args.cifar.resolve(), args.pretrain_epochs, args.backbone)
    if args.pretrain_only:
        return
    link_subset(args.cifar / "train", work / "target" / "train", TARGET, args.per_class)
    link_subset(args.cifar / "test", work / "target" / "val", TARGET, VAL_PER_CLASS)
    arms = {"scratch": [], "full": [f"--model.weights={weights}"]}
    epochs = dict.fromkeys(ARMS, args.epochs)
    # room: finetune begin
    epochs["schedule"] = args.schedule_epochs or args.epochs
    arms["schedule"] = [
        f"--model.weights={weights}",
        f"--model.head_epochs={max(1, epochs['schedule'] // 4)}",
        "--model.layer_decay=0.7",
    ]
    # room: finetune end
    arms = {k: v for k, v in arms.items() if k in args.arms.split(",")}
    results: dict[str, list[tuple[float, float]]] = {a: [] for a in arms}
    results |= {f"{a}+tta": [] for a in arms if a != "scratch"}  # room: recipes
    stamp = time.strftime("%H%M%S")
    for seed in range(args.seeds):
        for label, extra in arms.items():
            name = f"{label}-{args.backbone.replace('/', '-')}-{seed}-{stamp}"
            acc, seconds = arm(work, name, seed, epochs[label], args.lr, extra, args.backbone)
            results[label].append((acc, seconds))
            line = f"seed {seed} {label:<9} val/acc {acc:.4f}  {seconds:5.0f} s"
            # room: recipes begin
            if label != "scratch":
                tta = validate(work, name, ["--model.tta=flip"])
                results[f"{label}+tta"].append((tta, 0.0))
                line += f"   with --model.tta=flip: {tta:.4f}"
            # room: recipes end
            print(line, flush=True)
    base = statistics.mean(a for a, _ in results["full"]) if results.get("full") else 1.0
    for label, rows in results.items():
        accs = [a for a, _ in rows]
        spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
        secs = statistics.mean(s for _, s in rows)
        print(
            f"{label:<13} mean val/acc {statistics.mean(accs):.4f} ± {spread:.4f} (sd, {len(accs)} seeds)  "
            f"ratio to full {statistics.mean(accs) / base:.3f}  fit {secs:.0f} s"
        )


if __name__ == "__main__":
    main()
