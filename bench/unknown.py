"""How many photos of other things each unknown score answers `unknown`, at the export's acceptance.

    python bench/unknown.py --export checkpoints/<run>/latest.onnx --own data/shapes/val \
        --foreign data/cifar10/test [--count 1000]

Runs the export as `infer` runs it (`project.deploy.classifier.Classifier`: the same decoding, resize,
crop and calibration) on the model's own validation images and on up to --count foreign photos (evenly
spaced over the folder, any layout). For each score the export measured (knn, energy,
max_probability), at that score's threshold from the sidecar (`unknown_scores`: each accepts the same
share of validation images), it prints the share of each set answered `unknown`; then the shares that
`Classifier.classify`, the path of infer and serve, answers `unknown` with the score the export chose.
The goal of the template: at least 80 % of foreign photos `unknown` with at most 10 % of its own
validation images.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import numpy as np

from project.deploy import unknown
from project.deploy.classifier import Classifier
from project.deploy.outputs import Outputs

SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


def images(root: Path, count: int) -> list[Path]:
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in SUFFIXES)
    if len(files) <= count:
        return files
    return [files[i] for i in np.linspace(0, len(files) - 1, count).round().astype(int)]


def outputs(classifier: Classifier, paths: list[Path]) -> Outputs:
    """Logits and features of every image, preprocessed as infer does."""
    logits, features = [], []
    for start in range(0, len(paths), 64):
        batch = np.stack([classifier.preprocess(p) for p in paths[start : start + 64]])
        out = classifier.run(batch, features="features" in classifier.outputs)
        logits.append(out.logits)
        features.append(out.features)
    return Outputs(np.concatenate(logits), None if features[0] is None else np.concatenate(features))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", type=Path, required=True, help="an .onnx written by `project export`")
    parser.add_argument("--own", type=Path, required=True, help="the model's own validation images")
    parser.add_argument("--foreign", type=Path, required=True, help="photos of none of its classes")
    parser.add_argument("--count", type=int, default=1000, help="images read from each folder, at most")
    args = parser.parse_args()

    classifier = Classifier(args.export)
    meta = classifier.sidecar.to_dict()
    bank = classifier.sidecar.bank()
    temperature = classifier.calibration.temperature
    sets = {"own": images(args.own, args.count), "foreign": images(args.foreign, args.count)}
    print(f"export {args.export.resolve().name}: chose {meta.get('unknown_choice')}")
    print(
        f"machine: {platform.processor() or platform.machine()}; "
        f"own {len(sets['own'])}, foreign {len(sets['foreign'])}"
    )
    ran = {name: outputs(classifier, paths) for name, paths in sets.items()}
    accept = meta["unknown_scores"]["measured_at_accept"]
    rows = {}
    print(f"\n| score | threshold | own val unknown | foreign unknown |   (accepting {accept:.0%} of val)")
    print("| --- | --- | --- | --- |")
    for name, figures in meta["unknown_scores"].items():
        if not isinstance(figures, dict):
            continue
        shares = {
            part: float(
                (unknown.score(o.logits, name, temperature, o.features, bank) < figures["threshold"]).mean()
            )
            for part, o in ran.items()
        }
        rows[name] = shares
        print(f"| {name} | {figures['threshold']:.4f} | {shares['own']:.1%} | {shares['foreign']:.1%} |")
    answered = {
        part: float(np.mean([answer.unknown for answer in classifier.classify(paths)]))
        for part, paths in sets.items()
    }
    print(
        f"\nthrough Classifier.classify (infer, serve), score {classifier.calibration.score_name}: "
        f"own {answered['own']:.1%} unknown, foreign {answered['foreign']:.1%} unknown"
    )
    print(json.dumps({"scores": rows, "classify": answered}))


if __name__ == "__main__":
    main()
