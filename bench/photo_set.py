"""A public real-image set as train/ and val/ class folders: ELPV (solar cells in electroluminescence).

    python bench/photo_set.py --wheel elpv_dataset-1.0.0.post1-py3-none-any.whl --out /tmp/elpv

The benchmarks that need real camera images and not the embedded shapes use it, as the one public image
set of 2,000+ images in 4+ classes that installs from a package registry (no data set can be downloaded
here otherwise): `pip download --no-deps elpv-dataset==1.0.0.post1` fetches the 87 MB wheel (CC BY-NC-SA
4.0; Buerhop-Lutz et al. 2018, Deitsch et al. 2019). 2,624 grayscale 300x300 px PNG photos of mono- and
polycrystalline cells, each labelled with the probability that it is defective as judged by experts:
0, 1/3, 2/3 or 1, the four classes here (defect_000, defect_033, defect_067, defect_100: 1,508, 295, 106
and 715 images). Fixed stratified split, 80 % train and 20 % val, by a seeded shuffle per class (the same
folders on every machine). Files are hard-linked from an extracted copy, so the set costs its size once.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import zipfile
from collections import defaultdict
from pathlib import Path

VAL_FRACTION = 0.2
SEED = 0


def class_name(probability: str) -> str:
    return f"defect_{round(float(probability) * 100):03d}"


def build(wheel: Path, out: Path) -> dict[str, dict[str, int]]:
    """Extract the wheel's images beside `out` and link them into out/{train,val}/<class>/; the counts."""
    raw = out.parent / f"{out.name}-raw"
    if not (raw / "elpv_dataset" / "data" / "labels.csv").exists():
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(raw, [n for n in archive.namelist() if n.startswith("elpv_dataset/data/")])
    data = raw / "elpv_dataset" / "data"
    by_class: dict[str, list[str]] = defaultdict(list)
    with (data / "labels.csv").open() as rows:
        for row in csv.reader(rows, delimiter=" ", skipinitialspace=True):
            by_class[class_name(row[1])].append(row[0])
    counts: dict[str, dict[str, int]] = {"train": {}, "val": {}}
    for name, files in sorted(by_class.items()):
        files = sorted(files)
        random.Random(f"{SEED}-{name}").shuffle(files)
        cut = round(len(files) * VAL_FRACTION)
        for split, part in (("val", files[:cut]), ("train", files[cut:])):
            folder = out / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for file in part:
                target = folder / Path(file).name
                if not target.exists():
                    os.link(data / file, target)
            counts[split][name] = len(part)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help="elpv_dataset-1.0.0.post1-py3-none-any.whl")
    parser.add_argument("--out", type=Path, required=True, help="folder to write train/ and val/ into")
    args = parser.parse_args()
    for split, counts in build(args.wheel, args.out).items():
        print(f"{split}: {sum(counts.values())} images: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
