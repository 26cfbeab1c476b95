"""Photo settings against the shapes defaults on real photos, from scratch and from locally made weights.

    python bench/photo_settings.py --root /tmp/elpv --cifar /tmp/cifar10 [--work DIR] [--seeds 0 1]

What a newcomer gets on a folder of photos: bare `fit` (configs/default.yaml, tuned for the embedded
64 px shapes: 64 px, crops of 70-100 %, 4 epochs) against `--config configs/experiments/photos.yaml`,
each from scratch and from local pretrained weights (no weights can be downloaded here: the photo
settings' backbone is first trained on five CIFAR-10 classes at 32 px by bench/transfer.py's
`pretrain`, its head left out, and passed as `--model.weights=FILE`). `--root`: train/ and val/
folders of photos (bench/photo_set.py). Arms alternate seed by seed; prints per run the validation
accuracy of the last epoch (not the best: no selection on val) and the wall time, then the means.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import transfer

REPO = Path(__file__).resolve().parents[1]
PHOTOS = REPO / "configs" / "experiments" / "photos.yaml"
LAST_EPOCH = re.compile(r"^epoch \d+/\d+: .*val/acc (\d\.\d+)", re.MULTILINE)  # EpochLines
ARMS = {
    "defaults": [],
    "photos": [f"--config={PHOTOS}"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="train/ and val/ folders of photos")
    parser.add_argument("--cifar", type=Path, required=True, help="holds train/<class>/*.jpg (CIFAR-10)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/photo-settings"))
    parser.add_argument("--pretrain-epochs", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    backbone = yaml.safe_load(PHOTOS.read_text())["model"]["backbone"]
    weights = transfer.pretrain(args.work, args.cifar.resolve(), args.pretrain_epochs, backbone)
    results: dict[str, list[tuple[float, float]]] = {}
    for seed in args.seeds:
        for start, extra in (("scratch", []), ("weights", [f"--model.weights={weights}"])):
            for arm, config in ARMS.items():
                name = f"{arm}-{start}-{seed}"
                common = [f"--model.backbone={backbone}"] if arm == "defaults" else []
                out, seconds = transfer.run(
                    transfer.project(
                        "fit",
                        *config,
                        f"--data.root={args.root.resolve()}",
                        *common,
                        *extra,
                        f"--seed_everything={seed}",
                        "--data.num_workers=2",
                        "--export_best.enabled=false",
                        f"--name={name}",
                    ),
                    args.work,
                )
                score = float(LAST_EPOCH.findall(out)[-1])  # the last epoch's, not the best
                results.setdefault(f"{arm} {start}", []).append((score, seconds))
                print(f"{name}: val/acc {score:.4f} in {seconds:.0f} s", flush=True)
    print("\narm               val/acc (mean)  per seed          wall s (mean)")
    for key, rows in results.items():
        per_seed = ", ".join(f"{a:.3f}" for a, _ in rows)
        mean = statistics.mean(a for a, _ in rows)
        print(f"{key:17s} {mean:.3f}           {per_seed:17s} {statistics.mean(s for _, s in rows):.0f}")


if __name__ == "__main__":
    main()
