"""Time to accuracy on real photos: this template's photo settings against the tools people pick instead.

    python bench/peers.py --root /tmp/elpv --peers-python /opt/peers/bin/python --timm-train train.py \
        [--budget 360] [--size 128] [--seeds 0 1] [--arms photos timm fastai yolo shapes] [--plot out.png]
        [--template-args=--data.scale=[0.7,1.0] ...]     # a change to the template's settings, measured

Every tool trains from scratch (no weights can be downloaded here) on the same train/ and val/ folders
(bench/photo_set.py: ELPV, 2,099 + 525 images, 4 classes), at the same image size, within the same
wall-clock budget on the same machine, run the way its documentation trains an image classifier:

    photos   this template: `fit --config configs/experiments/photos.yaml`
    short    (not by default) the same, given `--short` (0.65) of the budget: does the template reach
             the best peer's final accuracy in 0.7x that peer's time when a user gives it that time?
    shapes   (not by default) the template's defaults, tuned for the embedded shapes, at the same size
    timm     timm's `train.py` (from its repository; not in the pip package) with its defaults for
             resnet18: SGD, 5 warm-up epochs, cosine, label smoothing 0.1, batch 128
    fastai   bench/peer_fastai.py: `vision_learner(resnet18, pretrained=False)` + `fit_one_cycle`
    yolo     bench/peer_yolo.py: Ultralytics `yolo11n-cls.yaml`, `model.train` with its defaults

The template and YOLO take a time budget themselves (`--trainer.max_time` with `--trainer.max_epochs=-1`;
`time=` in hours), and re-plan their schedules to the pace measured as they train; they get the
budget less 20 s of start-up. timm and fastai take epochs: a two-epoch probe measures each one's
start-up and steady epoch time, and its runs get as many epochs as fit the budget after the start-up
(a schedule that ends at the budget, as a user with that budget would set it; `--epochs ARM=N` skips
the probe). A run still going at 1.15x the budget is stopped.
Runs alternate (every arm for seed 0, then every arm for seed 1). Each epoch's validation accuracy is
stamped with the seconds since its process started. Prints every curve, then per arm the mean final
accuracy, the best peer, and for the template the time to reach the best peer's final accuracy as a
fraction of that peer's time (goal: at most 0.7). `--peers-python` is an environment with fastai,
ultralytics and timm (they are benchmark peers, not dependencies of the project).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EPOCH = re.compile(r"^epoch (\d+)(?:/\S+)?:? .*?(?:val/acc|acc) (\d\.\d+)")
TIMM_TEST = re.compile(r"Test: \[\s*(\d+)/(\d+)\].*Acc@1:\s*[\d.]+\s*\(\s*([\d.]+)\)")
PEERS = ("timm", "fastai", "yolo")
TIMED = ("photos", "short", "yolo")  # take a time budget themselves: no probe, no epoch count
START_UP = 20  # seconds before training starts (imports, indexing the folder): not in a tool's own budget


@dataclass
class Curve:
    arm: str
    seed: int
    epochs: int
    points: list[tuple[float, float]] = field(default_factory=list)  # (seconds, accuracy)
    seconds: float = 0.0
    stopped: bool = False

    def final(self) -> float:
        return self.points[-1][1] if self.points else float("nan")

    def time_to(self, accuracy: float) -> float:
        """Seconds until an epoch first reached `accuracy` (inf if never)."""
        return next((s for s, a in self.points if a >= accuracy - 1e-9), math.inf)


def command(arm: str, args: argparse.Namespace, epochs: int, seed: int, work: Path) -> list[str]:
    root, size = str(args.root), str(args.size)
    if arm in ("photos", "short", "shapes"):
        config = ["--config", str(REPO / "configs/experiments/photos.yaml")] if arm != "shapes" else []
        length = [f"--trainer.max_epochs={epochs}"]
        if arm != "shapes":  # the budget, as the template takes one: the schedule follows the pace
            seconds = int(args.budget * (args.short if arm == "short" else 1) - START_UP)
            length = [
                "--trainer.max_epochs=-1",
                f"--trainer.max_time=00:00:{seconds // 60:02d}:{seconds % 60:02d}",
            ]
        return [
            sys.executable, "-m", "project", "fit", *config, f"--data.root={root}",
            f"--data.image_size={size}", *length, f"--seed_everything={seed}",
            f"--data.num_workers={args.workers}", "--export_best.enabled=false", f"--name={arm}-{seed}",
            *args.template_args,
        ]  # fmt: skip
    if arm == "timm":
        return [
            args.peers_python, str(args.timm_train), "--data-dir", root, "--train-split", "train",
            "--val-split", "val", "--model", "resnet18", "--num-classes", str(classes(args.root)),
            "--img-size", size, "--epochs", str(epochs), "--seed", str(seed), "--workers", str(args.workers),
            "--device", "cpu", "--output", str(work / "timm"), "--log-interval", "1000",
        ]  # fmt: skip
    driver = REPO / "bench" / f"peer_{arm}.py"
    extra = []
    if arm == "yolo":  # a time budget: its epochs re-planned after each epoch (from its default 100: a
        # smaller count would also end the run, as its last epoch)
        extra = ["--out", str(work / "yolo"), "--hours", f"{(args.budget - START_UP) / 3600:.6f}"]
        epochs = epochs or 100
    common = ["--size", size, "--epochs", str(epochs), "--seed", str(seed), "--workers", str(args.workers)]
    return [args.peers_python, str(driver), root, *common, *extra]


def classes(root: Path) -> int:
    return sum(1 for p in (root / "train").iterdir() if p.is_dir())


def parse(arm: str, line: str) -> float | None:
    """The epoch's validation accuracy (0-1) if `line` reports one."""
    if arm == "timm":
        match = TIMM_TEST.search(line)
        if match and match[1] == match[2]:
            return float(match[3]) / 100
        return None
    match = EPOCH.match(line)
    return float(match[2]) if match else None


def run(arm: str, args: argparse.Namespace, epochs: int, seed: int, limit: float) -> Curve:
    curve = Curve(arm, seed, epochs)
    with tempfile.TemporaryDirectory(prefix=f"peers-{arm}-") as folder:
        work = Path(folder)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "YOLO_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        env["PYTHONPATH"] = str(REPO / "src")
        started = time.monotonic()
        process = subprocess.Popen(
            command(arm, args, epochs, seed, work), cwd=work, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            lines = read_lines(process, curve, started, limit)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, 9)  # its own session: ending this process would not end it
        process.wait()
        curve.seconds = time.monotonic() - started
        if process.returncode and not curve.stopped:
            sys.exit(f"{arm} failed ({process.returncode}):\n{''.join(lines)}")
    return curve


def read_lines(process: subprocess.Popen, curve: Curve, started: float, limit: float) -> list[str]:
    """Stamp each accuracy line of `process` into `curve`; stop it past `limit` s. Its last lines."""
    tail: list[str] = []
    for line in process.stdout:
        now = time.monotonic() - started
        tail = [*tail[-40:], line]
        accuracy = parse(curve.arm, line.strip())
        if accuracy is not None:
            curve.points.append((now, accuracy))
        if now > limit:
            curve.stopped = True
            break
    return tail


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress in a log file
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--peers-python", default=sys.executable)
    parser.add_argument("--timm-train", type=Path, help="timm's train.py, from its repository")
    parser.add_argument("--budget", type=float, default=360.0, help="seconds a run may take")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--short", type=float, default=0.65, help="the short arm's fraction of the budget")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1], help="none: summarize --add only")
    parser.add_argument("--arms", nargs="+", default=["photos", "timm", "fastai", "yolo"])
    parser.add_argument("--plot", type=Path, help="a PNG of accuracy against time (needs matplotlib)")
    parser.add_argument("--json", type=Path, help="write every curve here")
    parser.add_argument("--add", type=Path, nargs="*", default=[], help="earlier runs' curves (--json files)")
    parser.add_argument(
        "--template-args",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more fit flag for the template's arms (repeat it; write --template-args=--flag=value)",
    )
    parser.add_argument(
        "--epochs", nargs="*", default=[], metavar="ARM=N", help="an arm's epochs instead of its probe's"
    )
    args = parser.parse_args()
    args.epochs = {arm: int(n) for arm, n in (item.split("=") for item in args.epochs)}
    if "timm" in args.arms and not args.timm_train:
        parser.error(
            "--timm-train: the timm arm needs timm's train.py (github.com/huggingface/pytorch-image-models)"
        )
    print(
        f"{args.root}: budget {args.budget:.0f} s, {args.size} px, seeds {args.seeds}, arms {args.arms}",
        flush=True,
    )
    epochs = {arm: args.epochs[arm] for arm in args.arms if arm in args.epochs}
    for arm in [arm for arm in args.arms if arm not in epochs and arm not in TIMED and args.seeds]:
        probe = run(arm, args, 2, args.seeds[0], args.budget)
        (first, _), (second, _) = probe.points[:2]
        epoch = second - first  # steady: the first epoch also pays the start-up
        epochs[arm] = max(1, int((args.budget - (first - epoch)) // epoch))
        print(f"probe {arm}: start-up {first - epoch:.1f} s, an epoch {epoch:.1f} s -> {epochs[arm]} epochs")
    curves = [Curve(**curve) for path in args.add for curve in json.loads(path.read_text())]
    for seed in args.seeds:
        for arm in args.arms:
            curve = run(arm, args, epochs.get(arm, 0), seed, args.budget * 1.15)
            curves.append(curve)
            points = "  ".join(f"{s:.0f}s:{a:.3f}" for s, a in curve.points)
            note = " (stopped at 1.15x the budget)" if curve.stopped else ""
            length = f"{len(curve.points)} epochs in its time" if arm in TIMED else f"{curve.epochs} epochs"
            print(f"{arm} seed {seed}: {length}, {curve.seconds:.0f} s{note}: {points}")
    if args.json:
        args.json.write_text(json.dumps([c.__dict__ for c in curves], indent=1))
    summarize(curves, args.arms)
    if args.plot:
        plot(curves, args.plot, args.budget)


def summarize(curves: list[Curve], arms: list[str]) -> None:
    final = {arm: statistics.mean(c.final() for c in curves if c.arm == arm) for arm in arms}
    seconds = {arm: statistics.mean(c.seconds for c in curves if c.arm == arm) for arm in arms}
    print("\narm      final val acc (mean)  per seed            wall s (mean)")
    for arm in arms:
        per_seed = ", ".join(f"{c.final():.3f}" for c in curves if c.arm == arm)
        print(f"{arm:8s} {final[arm]:.3f}                 {per_seed:20s} {seconds[arm]:.0f}")
    peers = [arm for arm in arms if arm in PEERS]
    if "photos" not in arms or not peers:
        return
    best = max(peers, key=lambda arm: final[arm])
    print(f"\nbest peer: {best} {final[best]:.3f}; template photos {final['photos']:.3f} "
          f"({final['photos'] - final[best]:+.3f})")  # fmt: skip
    for seed in sorted({c.seed for c in curves}):
        ours = next(c for c in curves if c.arm == "photos" and c.seed == seed)
        theirs = next(c for c in curves if c.arm == best and c.seed == seed)
        target, their_time = theirs.final(), theirs.points[-1][0] if theirs.points else math.inf
        ratio = ours.time_to(target) / their_time
        print(f"seed {seed}: template reaches {best}'s final {target:.3f} at {ours.time_to(target):.0f} s, "
              f"{best} at {their_time:.0f} s: ratio {ratio:.2f} (goal <= 0.70)")  # fmt: skip
        short = next((c for c in curves if c.arm == "short" and c.seed == seed), None)
        if short and short.points:
            ended = short.points[-1][0]
            print(f"seed {seed}: template given the short budget ends at {short.final():.3f} "
                  f"({short.final() - target:+.3f} against {best}'s final) at {ended:.0f} s: "
                  f"ratio {ended / their_time:.2f} (goal <= 0.70)")  # fmt: skip


def plot(curves: list[Curve], path: Path, budget: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    colours = {}
    for curve in curves:
        seconds, accuracy = zip(*curve.points, strict=True) if curve.points else ((), ())
        line = axes.plot(
            [s / 60 for s in seconds], accuracy, marker=".", color=colours.get(curve.arm),
            linestyle="-" if curve.seed == curves[0].seed else "--",
            label=curve.arm if curve.arm not in colours else None,
        )  # fmt: skip
        colours.setdefault(curve.arm, line[0].get_color())
    axes.axvline(budget / 60, color="grey", linewidth=0.8)
    axes.set_xlabel("minutes since start (2 CPU cores)")
    axes.set_ylabel("validation accuracy")
    axes.set_title("From scratch on ELPV (4 classes), same budget; solid: first seed, dashed: the others")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
