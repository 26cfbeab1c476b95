"""Whole-process wall time: a classic hand-written training loop against `python -m project fit`.

    python bench/handwritten.py --root DATA [--baseline REV ...] [--rounds 3] [--shipped] [--threads N]
                                [--timm_train train.py --timm_path DIR]

DATA is a folder with train/ and val/ class folders (e.g. 200 CIFAR-10 JPEGs per class in train/
and 50 in val/). Both sides do the same work: resnet18 at 32 px from scratch, batch 64, 2 loader
workers, AdamW (lr 0.002, weight decay 0.05), 4 epochs, an evaluation after each epoch, random
resized crops (scale 0.7-1) and flips for training, resize + centre crop for evaluation.

- hand-written: `ImageFolder` + classic PIL transforms (`ToTensor`, `Normalize`) and the plain
  loop, in a fresh process (its imports counted, like the template's);
- template: `python -m project fit` with the default config and only the flags that make the work
  the same (`--export_best.enabled=false` unless `--shipped`: the end-of-fit export is extra work
  the hand-written loop does not do);
- template at REV (with `--baseline REV ...`): the same `fit` with REV's `src/` and `configs/`
  (extracted with `git archive`);
- timm's `train.py` (with `--timm_train`; it ships in timm's repository, github.com/huggingface/
  pytorch-image-models, not in the pip package; `--timm_path`: a folder holding the timm package,
  e.g. `pip install --target DIR timm`): the same model, data, optimizer, learning rate, weight
  decay, crops, flips, batch, workers and epochs, cosine schedule, no label smoothing or colour
  jitter, `--no-prefetcher --device cpu`. Its version and the file's sha256 are printed.

Each round runs every side once, the order rotating, each in a fresh process and an empty working
folder. Prints each time, the medians and the ratios hand-written / template (> 1: the template
is faster).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

LOOP = """
import sys
import torch, torchvision
from torch.nn import functional as F
from torchvision import datasets, transforms as T

root, epochs = sys.argv[1], int(sys.argv[2])
torch.manual_seed(42)
mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
train_tf = T.Compose([T.RandomResizedCrop(32, scale=(0.7, 1.0), ratio=(0.9, 1.11)),
                      T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])
eval_tf = T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor(), T.Normalize(mean, std)])
train = datasets.ImageFolder(f"{root}/train", train_tf)
val = datasets.ImageFolder(f"{root}/val", eval_tf)
loader = torch.utils.data.DataLoader(train, batch_size=64, shuffle=True, num_workers=2,
                                     drop_last=True, persistent_workers=True)
val_loader = torch.utils.data.DataLoader(val, batch_size=64, num_workers=2, persistent_workers=True)
model = torchvision.models.resnet18(num_classes=len(train.classes))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.002, weight_decay=0.05)
for epoch in range(epochs):
    model.train()
    for images, labels in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in val_loader:
            correct += (model(images).argmax(1) == labels).sum().item()
    print(f"epoch {epoch} loss {loss.item():.3f} val_acc {correct / len(val):.3f}", flush=True)
torch.save(model.state_dict(), "model.pt")
"""


def fit_command(root: str, epochs: int, shipped: bool) -> list[str]:
    command = [sys.executable, "-m", "project", "fit", f"--data.root={root}", "--model.backbone=resnet18"]
    command += ["--data.image_size=32", "--data.batch_size=64", "--data.num_workers=2"]
    command += [f"--trainer.max_epochs={epochs}"]
    return command + ([] if shipped else ["--export_best.enabled=false"])


def timm_command(train_py: str, root: str, epochs: int) -> list[str]:
    classes = sum(1 for p in Path(root, "train").iterdir() if p.is_dir())
    command = [sys.executable, str(Path(train_py).resolve()), "--data-dir", root, "--train-split", "train"]
    command += ["--val-split", "val", "--model", "resnet18", "--num-classes", str(classes)]
    command += ["--input-size", "3", "32", "32", "--crop-pct", f"{32 / 36:.4f}", "-b", "64"]
    command += ["--epochs", str(epochs), "--opt", "adamw", "--lr", "0.002", "--weight-decay", "0.05"]
    command += [
        "--sched",
        "cosine",
        "--warmup-epochs",
        "0",
        "--scale",
        "0.7",
        "1.0",
        "--ratio",
        "0.9",
        "1.11",
    ]
    command += [
        "--hflip",
        "0.5",
        "--color-jitter",
        "0",
        "--smoothing",
        "0",
        "--train-interpolation",
        "bilinear",
    ]
    command += ["--interpolation", "bilinear", "-j", "2", "--no-prefetcher", "--device", "cpu"]
    return [*command, "--output", "out", "--checkpoint-hist", "1"]


def timm_version(train_py: str, timm_path: str | None) -> str:
    env = {**os.environ, **({"PYTHONPATH": timm_path} if timm_path else {})}
    version = subprocess.run(
        [sys.executable, "-c", "import timm; print(timm.__version__)"],
        env=env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    digest = hashlib.sha256(Path(train_py).read_bytes()).hexdigest()[:12]
    return f"timm {version or '(not importable)'}, train.py sha256 {digest}"


def timed(command: list[str], src: Path | None, work: Path) -> float:
    """Seconds from start to exit of `command` run in an empty `work` folder."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    started = time.perf_counter()
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{' '.join(command[:4])} failed:\n{result.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", required=True, help="image folder with train/ and val/")
    parser.add_argument("--baseline", nargs="*", default=[], help="git revisions whose template to time too")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--shipped", action="store_true", help="keep the end-of-fit export on")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for every side (default: torch's)")
    parser.add_argument("--fit_args", nargs="*", default=[], help="extra flags for both templates' fit")
    parser.add_argument("--timm_train", help="timm's train.py (from its repository) to time too")
    parser.add_argument("--timm_path", help="folder with the timm package for --timm_train (PYTHONPATH)")
    args = parser.parse_args()
    root = str(Path(args.root).resolve())
    if args.threads:  # on a shared machine, spinning threads waiting for a busy core dominate otherwise
        os.environ["OMP_NUM_THREADS"] = str(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ours = tmp / "ours"  # a copy: editing the tree while this runs does not change what is measured
        shutil.copytree(HERE / "src", ours / "src", ignore=shutil.ignore_patterns("__pycache__"))
        fit = fit_command(root, args.epochs, args.shipped) + args.fit_args
        sides = {
            "hand-written": ([sys.executable, "-c", LOOP, root, str(args.epochs)], None),
            "template": (fit, ours / "src"),
        }
        if args.timm_train:
            print(timm_version(args.timm_train, args.timm_path), flush=True)
            timm_path = Path(args.timm_path).resolve() if args.timm_path else None
            sides["timm train.py"] = (timm_command(args.timm_train, root, args.epochs), timm_path)
        for revision in args.baseline:
            base = tmp / f"baseline-{revision}"
            base.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(HERE), "archive", revision, "src", "configs"],
                check=True,
                capture_output=True,
            )
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            sides[f"template at {revision}"] = (fit, base / "src")
        times: dict[str, list[float]] = {name: [] for name in sides}
        names = list(sides)
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                command, src = sides[name]
                seconds = timed(command, src, tmp / "work")
                times[name].append(seconds)
                print(
                    f"round {round_ + 1} {name}: {seconds:.1f} s (load {os.getloadavg()[0]:.2f})", flush=True
                )
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(", ".join(f"{name} median {s:.1f} s" for name, s in medians.items()))
    for name in names[1:]:
        print(f"hand-written / {name}: {medians['hand-written'] / medians[name]:.2f}")
    if "timm train.py" in medians:
        print(f"timm train.py / template: {medians['timm train.py'] / medians['template']:.2f}")


if __name__ == "__main__":
    main()
