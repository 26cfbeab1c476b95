"""How well `python -m project audit` finds planted faults, and how long it takes, on known-truth data.

    python bench/audit_quality.py [--tarball ../shared/datasets/cifar10-jpeg.tar.gz] [--classes 4]
        [--per_class 250] [--keep DIR] [-- AUDIT OPTIONS...]

Builds a corrupted copy of a clean set in a temporary folder: `--per_class` CIFAR-10 test JPEGs of
each of the first `--classes` classes, upscaled 32 -> 128 px (bicubic, JPEG quality 90), split 80/20
into train/ and val/; then 5% of the files are moved to a wrong class folder of their split (flipped
labels), and 40 copies are added: exact, resized to 96 px, re-encoded at quality 60, and cropped by
6% and resized back, half of them into the other split (leaks). Without the tarball the embedded
shapes generator (64 px) is the clean set. Then it runs the audit with default settings (plus
AUDIT OPTIONS) in a subprocess and prints:

- label issues: precision and recall of the flagged set, and recall in the top 2x as many images
  ranked by label quality (2 x the number of flipped files);
- duplicates: precision and recall of the pairs found against the planted pairs, and how many
  planted cross-split pairs were flagged leak=true;
- the wall time of the audit command.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
TARBALL = ROOT.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"
SIZE = 128
FLIP = 0.05
COPIES = 40
KINDS = ("exact", "resized", "recompressed", "cropped")


def clean_set(dest: Path, tarball: Path, classes: int, per_class: int, seed: int) -> list[Path]:
    """`per_class` images of `classes` classes, 128 px, split 80/20 into train/ and val/: the file list."""
    rng = np.random.default_rng(seed)
    if not tarball.is_file():
        from project.data.shapes import generate_shapes

        generate_shapes(dest, int(per_class * 0.8), per_class - int(per_class * 0.8), image_size=64)
        return sorted(dest.glob("*/*/*.jpg"))
    taken: dict[str, int] = {}
    files = []
    with tarfile.open(tarball) as tar:
        for member in tar:
            parts = member.name.split("/")
            if len(parts) != 4 or parts[1] != "test" or not member.isfile():
                continue
            name = parts[2]
            if name not in taken and len(taken) == classes:
                continue
            count = taken.setdefault(name, 0)
            if count >= per_class:
                continue
            split = "train" if rng.random() < 0.8 else "val"
            image = Image.open(io.BytesIO(tar.extractfile(member).read())).convert("RGB")
            path = dest / split / name / f"{count:04d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            image.resize((SIZE, SIZE), Image.Resampling.BICUBIC).save(path, quality=90)
            taken[name] = count + 1
    return sorted(files or dest.glob("*/*/*.jpg"))


def flip_labels(root: Path, files: list[Path], rng: np.random.Generator) -> set[str]:
    """Move FLIP of the files into another class folder of their split; their new relative paths."""
    classes = sorted(p.name for p in (root / "train").iterdir())
    flipped = set()
    for i in rng.choice(len(files), size=round(FLIP * len(files)), replace=False):
        path = files[i]
        other = rng.choice([c for c in classes if c != path.parent.name])
        target = path.parent.parent / other / f"flipped-{path.parent.name}-{path.name}"
        path.rename(target)
        flipped.add(str(target.relative_to(root)))
    return flipped


def add_copies(root: Path, files: list[Path], rng: np.random.Generator) -> list[tuple[str, str, bool]]:
    """COPIES altered copies of unflipped files, half in the other split: (original, copy, across)."""
    planted = []
    for n, i in enumerate(rng.choice(len(files), size=COPIES, replace=False)):
        source = files[i]
        across = n % 2 == 0
        split = source.parents[1].name
        if across:
            split = "val" if split == "train" else "train"
        kind = KINDS[n // 2 % len(KINDS)]  # each kind: half across the splits, half within
        target = root / split / source.parent.name / f"copy-{kind}-{n:02d}.jpg"
        image = Image.open(source)
        if kind == "exact":
            target.write_bytes(source.read_bytes())
        elif kind == "resized":
            image.resize((96, 96), Image.Resampling.BILINEAR).save(target, quality=90)
        elif kind == "recompressed":
            image.save(target, quality=60)
        else:
            w, h = image.size
            m = round(0.06 * w)
            image.crop((m, m, w - m, h - m)).resize((w, h), Image.Resampling.BICUBIC).save(target, quality=90)
        planted.append((str(source.relative_to(root)), str(target.relative_to(root)), across))
    return planted


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tarball", type=Path, default=TARBALL)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--per_class", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="build the data set here and keep it (and the audit)")
    parser.add_argument("--build_only", action="store_true", help="build the data set, do not audit it")
    args, audit_options = parser.parse_known_args()
    audit_options = [a for a in audit_options if a != "--"]
    work = args.keep or Path(tempfile.mkdtemp(prefix="audit-bench-"))
    data = work / "data"
    rng = np.random.default_rng(args.seed)
    files = clean_set(data, args.tarball, args.classes, args.per_class, args.seed)
    flipped = flip_labels(data, files, rng)
    unflipped = [f for f in files if f.exists()]
    planted = add_copies(data, unflipped, rng)
    total = len(list(data.glob("*/*/*.jpg")))
    source = "CIFAR-10 test JPEGs upscaled to 128 px" if args.tarball.is_file() else "embedded shapes, 64 px"
    print(f"{total} images ({source}), {len(flipped)} flipped labels, {len(planted)} planted copies")
    truth = "".join(f"{a},{b},{int(across)}\n" for a, b, across in planted)
    (work / "planted.csv").write_text("original,copy,across\n" + truth)
    (work / "flipped.txt").write_text("".join(f + "\n" for f in sorted(flipped)))
    if args.build_only:
        return

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [
        sys.executable,
        "-m",
        "project",
        "audit",
        f"--data.root={data}",
        "--name=bench",
        *audit_options,
    ]
    started = time.perf_counter()
    subprocess.run(command, cwd=work, env=env, check=True)
    seconds = time.perf_counter() - started
    out = work / "logs" / "bench" / "audit"

    issues = {row["file"] for row in read_csv(out / "label_issues.csv")}
    ranked = sorted(read_csv(out / "oof_probabilities.csv"), key=lambda r: float(r["label_quality"]))
    top = {row["file"] for row in ranked[: 2 * len(flipped)]}
    hits = len(issues & flipped)
    print(
        f"label issues: {len(issues)} flagged, precision {hits / max(1, len(issues)):.2f}, "
        f"recall {hits / len(flipped):.2f}; flipped in the top {2 * len(flipped)} by label quality: "
        f"{len(top & flipped)}/{len(flipped)} (recall@2x {len(top & flipped) / len(flipped):.2f})"
    )
    found = {frozenset((r["file_a"], r["file_b"])): r for r in read_csv(out / "duplicates.csv")}
    truth = {frozenset((a, b)): across for a, b, across in planted}
    caught = [pair for pair in truth if pair in found]
    leaks = sum(found[pair]["leak"] == "true" for pair in caught if truth[pair])
    by_kind = {k: sum(1 for p in caught for f in p if f"copy-{k}-" in f) for k in KINDS}
    print(
        f"duplicates: {len(found)} pairs found, precision {len(caught) / max(1, len(found)):.2f}, "
        f"recall {len(caught) / len(truth):.2f} (by kind: {by_kind}, of {len(truth) // len(KINDS)} each); "
        f"leaks flagged {leaks}/{sum(truth.values())}"
    )
    print(f"outliers: {len(read_csv(out / 'outliers.csv'))}; audit wall time {seconds:.0f} s")
    print(f"files: {work}")


if __name__ == "__main__":
    main()
