"""Wall time of the end-of-fit export (what `ExportBest` runs), this tree against a git revision.

    python bench/export_time.py --root DATA --baseline REV [--backbone resnet18 --image_size 32 --rounds 3]

Trains a checkpoint for a few batches on DATA (a folder with train/ and val/) with this tree's
`fit` (export off), then runs `export_checkpoint` on it as `ExportBest` does at the end of fit
(validation images to verify on, the data module for calibration) in fresh processes, alternating
this tree and REV's `src/` (extracted with `git archive`), swapping the order each round. Each
process prints the seconds spent in `export_checkpoint` (imports of torch and the project excluded:
they are already done at the end of a fit; onnx, onnxscript and onnxruntime included, as there).
Prints the medians and the ratio baseline / this tree.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

CHILD = """
import sys, time
from project.data.datamodule import ImageDataModule
from project.export import export_checkpoint
from project.trainer import validation_images
ckpt, root, size, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
datamodule = ImageDataModule(root=root, image_size=size)
datamodule.setup("fit")
started = time.perf_counter()
export_checkpoint(ckpt, images=validation_images(datamodule), output_dir=out, datamodule=datamodule)
print(f"EXPORT_SECONDS {time.perf_counter() - started:.3f}")
"""


def export_seconds(src: Path, ckpt: Path, root: str, size: int, out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(ckpt), root, str(size), str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        sys.exit(f"export with {src} failed:\n{result.stderr[-3000:]}")
    line = next(x for x in result.stdout.splitlines() if x.startswith("EXPORT_SECONDS"))
    return float(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", required=True, help="image folder with train/ and val/")
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = tmp / "baseline"
        base.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(HERE), "archive", args.baseline, "src"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        ours = tmp / "ours"  # a copy: editing the tree while this runs does not change what is measured
        shutil.copytree(HERE / "src", ours / "src", ignore=shutil.ignore_patterns("__pycache__"))
        run = tmp / "run"
        run.mkdir()
        fit = [sys.executable, "-m", "project", "fit", f"--model.backbone={args.backbone}"]
        fit += [f"--data.root={args.root}", f"--data.image_size={args.image_size}", "--trainer.max_epochs=1"]
        fit += ["--trainer.limit_train_batches=3", "--export_best.enabled=false"]
        env = {**os.environ, "PYTHONPATH": str(HERE / "src")}
        subprocess.run(fit, cwd=run, env=env, check=True, capture_output=True)
        ckpt = next(p for p in (run / "checkpoints").rglob("*.ckpt") if p.name != "last.ckpt")
        sides = {"baseline": base / "src", "this tree": ours / "src"}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for name in order:
                seconds = export_seconds(sides[name], ckpt, args.root, args.image_size, tmp / name)
                times[name].append(seconds)
                print(f"round {round_ + 1} {name}: {seconds:.2f} s", flush=True)
    base_s, ours_s = (statistics.median(times[name]) for name in sides)
    label = f"{args.backbone} {args.image_size} px"
    print(f"{label}, baseline {args.baseline}: median {base_s:.2f} s; this tree {ours_s:.2f} s")
    print(f"baseline / this tree: {base_s / ours_s:.2f}x (cores: {os.cpu_count()})")


if __name__ == "__main__":
    main()
