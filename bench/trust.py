"""Exports measured on real models and real images: their probabilities, answers and speed.

    python bench/trust.py --cifar /tmp/cifar10 [--parts shapes cifar] [--work DIR]

Models, each trained here with `python -m project fit` and exported with `python -m project export`:

- shapes: the default fit (mobilenet_v3_small, 64 px, 4 epochs on the embedded shapes);
- cifar: resnet18 at 32 px on a CIFAR-10 subset (--cifar_per_class training images per class, 4 epochs);
- resnet224 (also a part): resnet18 trained 3 epochs at 64 px on the shapes, then fine-tuned  # room: int8
  2 epochs at 224 px on shapes drawn at 224 px (int8 speed and agreement at that size).  # room: int8

For each: the ECE before/after the temperature (from the sidecar).  # room: calibration
# room: unknown begin
For shapes and cifar the unknown rejection too: the threshold chosen on the validation split (95%
accepted) for each score, then the share of *new* in-distribution images accepted and of images of
the other data set rejected (CIFAR-10 test photos for shapes, drawn shapes for CIFAR-10), and the
AUROC of each score at telling the two apart. The scores: `energy` and `max_probability` (what an
export can use), and `feature_distance`, minus the Mahalanobis distance of the head's input to the
nearest class mean (training features, shared covariance; measured here only).
# room: unknown end
Each is exported with `--quantize int8` too: the int8 model's agreement, accuracies and  # room: int8
latency at batch 1 and 8 (from its sidecar: float and int8 alternate in one process).  # room: int8
A model this bench already trained in --work is reused: a second run only measures again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable  # room: unknown
from pathlib import Path

import numpy as np  # room: unknown
import torch  # room: int8

from project.data.index import list_images

# room: unknown begin
from project.data.shapes import generate_shapes
from project.deploy import unknown
from project.deploy.classifier import Classifier
from project.export.fit_unknown import separation

# room: unknown end

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
PARTS = ["shapes", "cifar"]
PARTS.append("resnet224")  # room: int8
EXPORT = []  # `export`'s own flags
EXPORT.append("--quantize=int8")  # room: int8


def project(work: Path, *args: str) -> None:
    command = [sys.executable, "-m", "project", *args]
    subprocess.run(command, cwd=work, env=ENV, check=True, stdout=subprocess.DEVNULL)


def fit(work: Path, name: str, *flags: str, export: bool = True) -> Path:
    """`fit` in `work` (unless this bench already trained it), then `export` (with EXPORT's flags) of
    the best checkpoint; the run's checkpoint folder."""
    run = work / "checkpoints" / name
    start = time.perf_counter()
    if not (run / "last.ckpt").is_file():
        project(work, "fit", f"--name={name}", "--export_best.enabled=false", *QUIET, *flags)
        print(f"# {name}: fit in {time.perf_counter() - start:.0f} s", flush=True)
    if export:
        start = time.perf_counter()
        best = max(run.glob("epoch=*.ckpt"), key=lambda p: float(p.stem.split("val_acc=")[1]))
        project(work, "export", f"--ckpt_path={best}", *EXPORT, *QUIET)
        print(f"# {name}: {' '.join(['export', *EXPORT])} in {time.perf_counter() - start:.0f} s", flush=True)
    return run


def files(folder: Path, per_class: int | None = None) -> list[Path]:
    """Image files under class folders of `folder` (the first `per_class` of each class)."""
    out: list[Path] = []
    for cls in sorted(p for p in folder.iterdir() if p.is_dir()):
        names = sorted(list_images(cls))[:per_class]
        out += [cls / n for n in names]
    return out


# room: unknown begin
def logits(classifier: Classifier, paths: list[Path]) -> np.ndarray:
    chunks = []
    for start in range(0, len(paths), 64):
        batch = np.stack([classifier.preprocess(p) for p in paths[start : start + 64]])
        chunks.append(classifier.logits(batch))
    return np.concatenate(chunks)


def features(run: Path, classifier: Classifier, paths: list[Path]) -> np.ndarray:
    """Penultimate features (the head's input) of the run's best checkpoint, preprocessed as infer does."""
    import torch

    from project.backbones import head_of
    from project.checkpoint_io import load_checkpoint_file
    from project.export import Deployable, load_for_export

    meta = json.loads((run / "latest.json").read_text())
    model = Deployable(load_for_export(load_checkpoint_file(Path(meta["source_checkpoint"]["path"]))))
    captured: list[torch.Tensor] = []
    hook = head_of(model.net).register_forward_hook(lambda m, i, o: captured.append(i[0].flatten(1)))
    with torch.no_grad():
        for start in range(0, len(paths), 64):
            model(torch.from_numpy(np.stack([classifier.preprocess(p) for p in paths[start : start + 64]])))
    hook.remove()
    return torch.cat(captured).double().numpy()


def mahalanobis(train: np.ndarray, labels: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Minus the smallest Mahalanobis distance to a class mean (shared covariance of training features)."""
    means = np.stack([train[labels == c].mean(0) for c in np.unique(labels)])
    centred = train - means[labels]
    precision = np.linalg.pinv(np.cov(centred, rowvar=False) + 1e-6 * np.eye(train.shape[1]))

    def score(x: np.ndarray) -> np.ndarray:
        d = x[:, None, :] - means[None]
        return -((d @ precision) * d).sum(-1).min(1)

    return score


def rejection(
    run: Path, val: list[Path], known: list[Path], other: list[Path], train: list[Path], accept: float = 0.95
) -> list[dict]:
    """Per score: threshold on `val`, share of `known` accepted and of `other` rejected, AUROC."""
    classifier = Classifier(run / "latest.onnx")
    temperature = classifier.calibration.temperature
    v, k, o = logits(classifier, val), logits(classifier, known), logits(classifier, other)
    scores = {name: [unknown.score(x, name, temperature) for x in (v, k, o)] for name in unknown.SCORES}
    labels = np.array([classifier.class_names.index(p.parent.name) for p in train])
    distance = mahalanobis(features(run, classifier, train), labels)
    scores["feature_distance"] = [distance(features(run, classifier, x)) for x in (val, known, other)]
    rows = []
    for name, (sv, sk, so) in scores.items():
        threshold = unknown.threshold_for(unknown.quantiles(sv), accept)
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


# room: unknown end
def summary(run: Path) -> dict:
    meta = json.loads((run / "latest.json").read_text())  # room: calibration
    result = {
        "temperature": meta["temperature"],  # room: calibration
        "ece_before": meta["ece_before"],  # room: calibration
        "ece_after": meta["ece_after"],  # room: calibration
        "validation_images": meta.get("calibration_images"),  # room: calibration
    }
    # room: int8 begin
    int8 = json.loads((run / "latest-int8.json").read_text())
    lat = int8["latency_ms"]
    result |= {
        "agreement": int8["agreement"],
        "accuracy_float": int8["accuracy_float"],
        "accuracy_int8": int8["accuracy_int8"],
        "latency_ms": lat,
        "speedup": {b: lat["float"][b] / lat["int8"][b] for b in ("1", "8")},
    }
    # room: int8 end
    return result


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
    parser.add_argument("--parts", nargs="+", default=PARTS)
    parser.add_argument("--cifar_per_class", type=int, default=1000)
    args = parser.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    fresh_shapes = generate_shapes(work / "shapes-fresh", 0, 100, image_size=64, seed=123)  # room: unknown
    cifar_test = files(args.cifar / "test", 100)  # room: unknown
    if "shapes" in args.parts:
        run = fit(work, "shapes")
        val = files(work / "data" / "shapes" / "val")  # room: unknown
        results["shapes"] = summary(run)
        # room: unknown begin
        results["shapes"]["rejection"] = rejection(
            run, val, files(fresh_shapes / "val"), cifar_test, files(work / "data" / "shapes" / "train", 200)
        )
        # room: unknown end
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
        results["cifar"] = summary(run)
        # room: unknown begin
        in_val = {(p.parent.name, p.name) for p in files(root / "val")}
        held_out = [p for p in files(args.cifar / "test") if (p.parent.name, p.name) not in in_val][::9]
        results["cifar"]["rejection"] = rejection(
            run, files(root / "val"), held_out, files(fresh_shapes / "val"), files(root / "train", 300)
        )
        # room: unknown end
        print(json.dumps(results["cifar"], indent=1), flush=True)
    # room: int8 begin
    if "resnet224" in args.parts:
        from project.data import shapes

        # from scratch at 224 px this CPU trains too slowly: 3 epochs at 64 px on the 4,800 shapes,
        # then those weights (all but the head) fine-tuned for 2 epochs at 224 px on shapes drawn at 224
        small = ["--model.backbone=resnet18", "--data.image_size=64", "--trainer.max_epochs=3"]
        warm = fit(work, "resnet64", *small, export=False)
        best = work / "resnet64-net.pt"  # the network alone: --model.weights takes a state dict
        state = torch.load(sorted(warm.glob("epoch=*.ckpt"))[-1], map_location="cpu", weights_only=True)
        torch.save({k: v for k, v in state["state_dict"].items() if k.startswith("net.")}, best)
        root = shapes.generate_shapes(work / "shapes-224", 60, 20, image_size=224)
        flags = [f"--data.root={root}", "--data.image_size=224", "--data.batch_size=16"]
        flags += ["--model.backbone=resnet18", f"--model.weights={best}", "--trainer.max_epochs=2"]
        flags += ["--model.scheduler.init_args.warmup_steps=5"]
        run = fit(work, "resnet224", *flags)
        results["resnet224"] = summary(run)
        print(json.dumps(results["resnet224"], indent=1), flush=True)
    # room: int8 end
    (work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results in {work / 'results.json'}")


if __name__ == "__main__":
    main()
