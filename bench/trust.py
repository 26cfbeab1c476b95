"""Calibration, unknown rejection and int8 export, measured on real models and real images.

    python bench/trust.py --cifar /tmp/cifar10 [--parts shapes cifar resnet224] [--work DIR]

Three models, each trained here with `python -m project fit` and exported with `--quantize int8`:

- shapes: the default fit (mobilenet_v3_small, 64 px, 4 epochs on the embedded shapes);
- cifar: resnet18 at 32 px on a CIFAR-10 subset (--cifar_per_class training images per class, 4 epochs);
- resnet224: resnet18 at 224 px on shapes drawn at 224 px, trained briefly (int8 speed at that size).

For each: the ECE before/after the temperature (from the sidecar), the int8 model's agreement,
accuracies and latency at batch 1 and 8 (from its sidecar: float and int8 alternate in one
process), and for shapes and cifar the unknown rejection: the threshold chosen on the validation
split (95% accepted) for each score, then the share of *new* in-distribution images accepted and of
images of the other data set rejected (CIFAR-10 test photos for shapes, drawn shapes for CIFAR-10),
and the AUROC of each score at telling the two apart.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from project import calibration
from project.calibrate import separation
from project.data.index import list_images
from project.data.shapes import generate_shapes
from project.infer import Classifier

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def fit(work: Path, name: str, *flags: str) -> Path:
    """Run `fit` with an int8 export in `work`; the run's checkpoint folder."""
    command = [
        sys.executable,
        "-m",
        "project",
        "fit",
        f"--name={name}",
        "--export_best.quantize=int8",
        *QUIET,
    ]
    start = time.perf_counter()
    subprocess.run([*command, *flags], cwd=work, env=ENV, check=True, stdout=subprocess.DEVNULL)
    print(f"# {name}: fit + export + int8 in {time.perf_counter() - start:.0f} s", flush=True)
    return work / "checkpoints" / name


def files(folder: Path, per_class: int | None = None) -> list[Path]:
    """Image files under class folders of `folder` (the first `per_class` of each class)."""
    out: list[Path] = []
    for cls in sorted(p for p in folder.iterdir() if p.is_dir()):
        names = sorted(list_images(cls))[:per_class]
        out += [cls / n for n in names]
    return out


def logits(classifier: Classifier, paths: list[Path]) -> np.ndarray:
    chunks = []
    for start in range(0, len(paths), 64):
        batch = np.stack([classifier.preprocess(p) for p in paths[start : start + 64]])
        chunks.append(classifier.logits(batch))
    return np.concatenate(chunks)


def rejection(
    run: Path, val: list[Path], known: list[Path], other: list[Path], accept: float = 0.95
) -> list[dict]:
    """Per score: threshold on `val`, share of `known` accepted and of `other` rejected, AUROC."""
    classifier = Classifier(run / "latest.onnx")
    temperature = classifier.calibration.temperature
    v, k, o = logits(classifier, val), logits(classifier, known), logits(classifier, other)
    rows = []
    for name in calibration.SCORES:
        sv, sk, so = (calibration.score(x, name, temperature) for x in (v, k, o))
        threshold = calibration.threshold_for(calibration.quantiles(sv), accept)
        rows.append(
            {
                "score": name,
                "threshold": threshold,
                "accepted_in_distribution": float((sk >= threshold).mean()),
                "rejected_out_of_distribution": float((so < threshold).mean()),
                "auroc": separation(sk, so),
            }
        )
    return rows


def summary(run: Path) -> dict:
    meta = json.loads((run / "latest.json").read_text())
    int8 = json.loads((run / "latest-int8.json").read_text())
    lat = int8["latency_ms"]
    return {
        "temperature": meta["temperature"],
        "ece_before": meta["ece_before"],
        "ece_after": meta["ece_after"],
        "validation_images": meta.get("calibration_images"),
        "agreement": int8["agreement"],
        "accuracy_float": int8["accuracy_float"],
        "accuracy_int8": int8["accuracy_int8"],
        "latency_ms": lat,
        "speedup": {b: lat["float"][b] / lat["int8"][b] for b in ("1", "8")},
    }


def cifar_subset(cifar: Path, folder: Path, train: int, val: int) -> Path:
    """train/ and val/ of symlinks: the first `train` training and `val` test images of each class."""
    for split, source, count in (("train", cifar / "train", train), ("val", cifar / "test", val)):
        for path in files(source, count):
            link = folder / split / path.parent.name / path.name
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                link.symlink_to(path)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cifar", type=Path, required=True, help="the cifar10/ folder (train/, test/)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-trust"))
    parser.add_argument("--parts", nargs="+", default=["shapes", "cifar", "resnet224"])
    parser.add_argument("--cifar_per_class", type=int, default=1000)
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    fresh_shapes = generate_shapes(work / "shapes-fresh", 0, 100, image_size=64, seed=123)
    cifar_test = files(args.cifar / "test", 100)
    if "shapes" in args.parts:
        run = fit(work, "shapes")
        val = files(work / "data" / "shapes" / "val")
        results["shapes"] = summary(run) | {
            "rejection": rejection(run, val, files(fresh_shapes / "val"), cifar_test)
        }
        print(json.dumps(results["shapes"], indent=1), flush=True)
    if "cifar" in args.parts:
        root = cifar_subset(args.cifar, work / "cifar-subset", args.cifar_per_class, 100)
        flags = [
            f"--data.root={root}",
            "--data.image_size=32",
            "--data.crop_ratio=1.0",
            "--data.batch_size=64",
        ]
        flags += ["--model.backbone=resnet18", "--model.optimizer.init_args.lr=0.002"]
        run = fit(work, "cifar", *flags)
        in_val = {(p.parent.name, p.name) for p in files(root / "val")}
        held_out = [p for p in files(args.cifar / "test") if (p.parent.name, p.name) not in in_val][::9]
        results["cifar"] = summary(run) | {
            "rejection": rejection(run, files(root / "val"), held_out, files(fresh_shapes / "val"))
        }
        print(json.dumps(results["cifar"], indent=1), flush=True)
    if "resnet224" in args.parts:
        root = generate_shapes(work / "shapes-224", 60, 20, image_size=224)
        flags = [f"--data.root={root}", "--data.image_size=224", "--data.batch_size=16"]
        flags += ["--model.backbone=resnet18", "--trainer.max_epochs=2"]
        run = fit(work, "resnet224", *flags)
        results["resnet224"] = summary(run)
        print(json.dumps(results["resnet224"], indent=1), flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results in {work / 'results.json'}")


if __name__ == "__main__":
    main()
