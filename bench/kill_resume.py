"""Soak test: kill `fit` with SIGKILL at random moments, resume with `--ckpt_path last`, compare.

    python bench/kill_resume.py [--trials 20] [--seed 0] [--epochs 4] [--kills 2] [--keep DIR]

A reference fit runs uninterrupted. Each trial then starts the same fit (same seed, CPU, tiny
data, workers 0) under its own run name and SIGKILLs it, by turns: right when a checkpoint's
temporary `.partial` file appears (in the middle of a checkpoint write); at a random moment of
the run, start-up included (uniform over the duration of the latest whole fit); or at a random
moment in the half second after the first last.ckpt appears (mid-epoch). After each kill it
checks that every `*.ckpt` on disk loads weights-only, that `last.ckpt` never goes back in time
and that its step count matches its epoch; then it resumes with `--name <run> --ckpt_path last`
(killing again, up to --kills times) until the fit ends. The finished run must equal the
reference: same epoch and step, bit-identical weights and optimizer state, the same monitored
scores, and every reference checkpoint file present.
Prints one row per trial and a summary; exits 1 if any trial differs.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

STEPS_PER_EPOCH = 3  # 6 classes x 8 training images / batch size 16


def fit_command(root: Path, name: str, epochs: int, resume: bool) -> list[str]:
    """The fit every run of the soak makes: tiny data, small network, one process, no export."""
    command = [sys.executable, "-m", "project", "fit", f"--name={name}"]
    command += [
        f"--data.root={root}",
        "--data.image_size=32",
        "--data.batch_size=16",
        "--data.num_workers=0",
        "--model.backbone=mobilenet_v3_small",  # has dropout: its draws must be resumed exactly too
        "--model.bn_momentum=0.1",
        "--model.scheduler.init_args.warmup_steps=2",
        f"--trainer.max_epochs={epochs}",
        "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--export_best.enabled=false",
    ]
    return command + (["--ckpt_path=last"] if resume else [])


def make_data(root: Path) -> Path:
    from project.data.shapes import generate_shapes

    return generate_shapes(root, 8, 4, image_size=32)


def environment() -> dict[str, str]:
    """The subprocesses import this checkout's package, whatever is installed."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def checkpoint_state(run: Path) -> dict[str, dict]:
    """Every final-named checkpoint of a run, loaded (a truncated one raises)."""
    return {p.name: load(p) for p in sorted(run.glob("*.ckpt"))}


@dataclass
class Trial:
    name: str
    mode: str
    kills: int = 0
    kills_in_write: int = 0
    resumes: int = 0
    restarts: int = 0
    lost: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems and self.lost == 0


def run_fit(work: Path, command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=work, env=environment(), stdout=out, stderr=subprocess.STDOUT)


def kill_at_random(proc: subprocess.Popen, delay: float) -> bool:
    """SIGKILL after `delay` seconds unless the fit ended before; True if it was killed."""
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def kill_after_checkpoint(proc: subprocess.Popen, run: Path, delay: float) -> bool:
    """SIGKILL `delay` seconds after the run's first last.ckpt exists (mid-way through a later epoch)."""
    while not (run / "last.ckpt").exists():
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    return kill_at_random(proc, delay)


def kill_in_write(proc: subprocess.Popen, run: Path, skip: int) -> bool:
    """SIGKILL as soon as the (skip+1)-th new checkpoint `.partial` file is seen; True if killed."""
    seen: set[tuple[str, int]] = set()
    while proc.poll() is None:
        for partial in run.glob(".*.partial"):
            try:
                key = (partial.name, partial.stat().st_mtime_ns)
            except FileNotFoundError:  # renamed in between: the write finished
                continue
            if key not in seen:
                seen.add(key)
                if len(seen) > skip:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    return True
        time.sleep(0.005)
    return False


def inspect_after_kill(trial: Trial, run: Path, last_step: int) -> int:
    """Check what a kill left; returns the step of last.ckpt (or the previous one if there is none)."""
    try:
        states = checkpoint_state(run)
    except Exception as e:  # a final-named file that does not load: the one thing that must not happen
        trial.lost += 1
        trial.problems.append(f"unloadable checkpoint after kill: {e}")
        return last_step
    last = states.get("last.ckpt")
    if last is None:
        if last_step >= 0:
            trial.lost += 1
            trial.problems.append("last.ckpt disappeared")
        return last_step
    step, epoch = last["global_step"], last["epoch"]
    if step < last_step:
        trial.lost += 1
        trial.problems.append(f"last.ckpt went back from step {last_step} to {step}")
    if step != (epoch + 1) * STEPS_PER_EPOCH:
        trial.problems.append(f"last.ckpt has epoch {epoch} but step {step}")
    return step


def compare(trial: Trial, run: Path, reference: dict[str, dict]) -> None:
    """The finished trial against the uninterrupted reference run."""
    final = checkpoint_state(run)
    missing = sorted(set(reference) - set(final))
    if missing:
        trial.problems.append(f"missing checkpoints {missing}")
    for name, expected in reference.items():
        got = final.get(name)
        if got is None:
            continue
        if (got["epoch"], got["global_step"]) != (expected["epoch"], expected["global_step"]):
            trial.problems.append(f"{name}: epoch/step {got['epoch']}/{got['global_step']}")
        if not _equal(got["state_dict"], expected["state_dict"]):
            trial.problems.append(f"{name}: weights differ")
        if not _equal(got["optimizer_states"], expected["optimizer_states"]):
            trial.problems.append(f"{name}: optimizer state differs")
        if _scores(got) != _scores(expected):
            trial.problems.append(f"{name}: scores {_scores(got)} != {_scores(expected)}")


def _scores(checkpoint: dict) -> list[float]:
    state = next(v for k, v in checkpoint["callbacks"].items() if k.startswith("ModelCheckpoint"))
    return sorted(float(v) for v in state["best_k_models"].values())


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


def run_reference(work: Path, root: Path, epochs: int) -> tuple[dict[str, dict], float]:
    start = time.perf_counter()
    proc = run_fit(work, fit_command(root, "reference", epochs, resume=False), work / "reference.log")
    if proc.wait() != 0:
        raise SystemExit(f"the reference fit failed; see {work / 'reference.log'}")
    return checkpoint_state(work / "checkpoints" / "reference"), time.perf_counter() - start


def run_trial(
    work: Path,
    root: Path,
    epochs: int,
    name: str,
    mode: str,
    duration: float,
    rng: random.Random,
    kills: int,
    window: tuple[float, float] = (0.05, 0.95),
) -> Trial:
    """Fit under `name`, killing it up to `kills` times, until it ends; then compare to the reference."""
    trial, start = Trial(name, mode), time.perf_counter()
    run, log = work / "checkpoints" / name, work / f"{name}.log"
    resume, last_step = False, -1
    while True:
        proc = run_fit(work, fit_command(root, name, epochs, resume), log)
        if trial.kills < kills:
            if mode == "write":
                killed = kill_in_write(proc, run, skip=rng.randrange(2 * epochs))
            elif mode == "epoch":
                killed = kill_after_checkpoint(proc, run, rng.uniform(0, 0.5))
            else:
                killed = kill_at_random(proc, rng.uniform(*window) * duration)
        else:
            killed = False
            proc.wait()
        if not killed:
            if proc.returncode != 0:
                trial.problems.append(f"fit exited with {proc.returncode}; see {log}")
            break
        trial.kills += 1
        trial.kills_in_write += mode == "write"
        last_step = inspect_after_kill(trial, run, last_step)
        if (run / "last.ckpt").is_file():
            resume = True
            trial.resumes += 1
        else:  # killed before the first checkpoint was complete: nothing to resume, start again
            shutil.rmtree(run, ignore_errors=True)
            shutil.rmtree(work / "logs" / name, ignore_errors=True)
            resume = False
            trial.restarts += 1
    trial.seconds = time.perf_counter() - start
    return trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--kills", type=int, default=2, help="kills per trial at most")
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="kill-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    root = make_data(work / "data")
    reference, duration = run_reference(work, root, args.epochs)
    print(f"reference: {duration:.1f} s, checkpoints {sorted(reference)}")
    rng = random.Random(args.seed)
    print(
        f"{'trial':6} {'mode':6} {'kills':>5} {'in write':>8} {'resumes':>7} {'restarts':>8} {'lost':>4} "
        f"{'s':>5}  result"
    )
    trials = []
    for i in range(args.trials):
        mode = ("write", "random", "epoch")[i % 3]
        trial = run_trial(work, root, args.epochs, f"t{i:02d}", mode, duration, rng, args.kills)
        compare(trial, work / "checkpoints" / trial.name, reference)
        trials.append(trial)
        if trial.kills == 0:  # one whole fit from scratch: the machine's current speed, for random kills
            duration = trial.seconds
        print(
            f"{trial.name:6} {trial.mode:6} {trial.kills:5} {trial.kills_in_write:8} {trial.resumes:7} "
            f"{trial.restarts:8} {trial.lost:4} {trial.seconds:5.0f}  "
            + ("identical to the reference" if trial.ok else "; ".join(trial.problems)),
            flush=True,
        )
    total = {
        k: sum(getattr(t, k) for t in trials)
        for k in ("kills", "kills_in_write", "resumes", "restarts", "lost")
    }
    print(
        f"\n{len(trials)} trials: {total['kills']} SIGKILLs "
        f"({total['kills_in_write']} during a checkpoint write), "
        f"{total['resumes']} resumes, {total['restarts']} restarts before any checkpoint, "
        f"{total['lost']} files lost, {sum(t.ok for t in trials)} identical to the reference."
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if all(t.ok for t in trials) else 1)


if __name__ == "__main__":
    main()
