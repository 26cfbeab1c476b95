"""Real subprocesses, real signals: SIGTERM/Ctrl-C save a resumable checkpoint; SIGKILL loses no file."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

import project
from project import runs
from project.callbacks.graceful_stop import Interrupted
from project.callbacks.run_summary import RunSummary
from tests.helpers import fast_args, run_cli

ROOT = Path(__file__).resolve().parents[1]
SMALL = "--model.backbone=mobilenet_v3_small"  # 18 MB checkpoints


def start_fit(workdir: Path, *args: str) -> subprocess.Popen:
    """`python -m project fit ARGS` in its own process group, as a terminal or a scheduler starts it."""
    env = {**os.environ, "PYTHONPATH": str(Path(project.__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "project", "fit", *args]
    return subprocess.Popen(
        command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "workers"),
    [(signal.SIGTERM, 0), (signal.SIGINT, 2), (signal.SIGTERM, 2)],
    ids=["SIGTERM", "SIGINT-with-workers", "SIGTERM-with-workers"],
)
def test_signal_stops_after_the_batch_with_a_resumable_checkpoint(
    workdir: Path, shapes_root: Path, signum: signal.Signals, workers: int
) -> None:
    name = f"stop-{signum.name}"
    args = fast_args(
        shapes_root, f"--name={name}", SMALL, "--trainer.max_epochs=100", f"--data.num_workers={workers}"
    )
    proc = start_fit(workdir, *args)
    run = workdir / "checkpoints" / name
    wait_for(run / "last.ckpt", proc)  # epoch 0 is done: training is under way
    os.killpg(proc.pid, signum)  # the whole group, as Ctrl-C in a terminal does (loader workers too)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 128 + signum, output
    assert f"Received {signum.name}: stopping after this batch" in output
    assert f"Resume with:\n  python -m project fit --name {name} --ckpt_path last" in output
    # the closing block, after the checkpoint was saved: where the run is and how to go on
    block = output[output.index(f"Run '{name}' stopped (exit status {128 + signum})") :]
    assert f"  last:         checkpoints/{name}/last.ckpt\n" in block
    assert f"  python -m project fit --name {name} --ckpt_path last   # resume" in block
    assert "Traceback" not in output
    with pytest.raises(ProcessLookupError):  # the fit stopped its loader workers: none is left behind
        os.killpg(proc.pid, 0)
    saved = torch.load(run / "last.ckpt", weights_only=True)
    assert saved["global_step"] >= 3  # at least epoch 0's three steps
    assert not list(run.glob(".*.partial"))
    if signum != signal.SIGTERM:
        return
    epochs = saved["epoch"] + 2
    resume = fast_args(
        shapes_root, f"--name={name}", SMALL, "--ckpt_path=last", f"--trainer.max_epochs={epochs}"
    )
    assert run_cli("fit", *resume) == 0
    final = torch.load(run / "last.ckpt", weights_only=True)
    assert (final["epoch"], final["global_step"]) == (epochs - 1, epochs * 3)  # steps continue, none repeated


def load_soak():
    spec = importlib.util.spec_from_file_location("kill_resume", ROOT / "bench" / "kill_resume.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path: Path, shapes_root: Path) -> None:
    """Two trials of bench/kill_resume.py: one killed inside a checkpoint write, one mid-epoch."""
    soak = load_soak()
    reference, duration = soak.run_reference(tmp_path, shapes_root, epochs=2)
    rng = random.Random(0)
    for mode in ("write", "epoch"):
        trial = soak.run_trial(tmp_path, shapes_root, 2, f"t-{mode}", mode, duration, rng, kills=1)
        soak.compare(trial, tmp_path / "checkpoints" / trial.name, reference)
        assert trial.ok, trial.problems
        assert (trial.kills, trial.resumes, trial.lost) == (1, 1, 0)


def live_children(pid: int) -> list[int]:
    """Running (not zombie) child processes of `pid`, read from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:  # ended meanwhile
            continue
        if ppid == str(pid) and state != "Z":
            found.append(int(stat.parent.name))
    return found


def is_running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_resume_at_once_after_sigkill_while_loader_workers_live_on(workdir: Path, shapes_root: Path) -> None:
    name = "killed"
    args = fast_args(shapes_root, f"--name={name}", SMALL, "--trainer.max_epochs=100", "--data.num_workers=2")
    proc = start_fit(workdir, *args)
    run = workdir / "checkpoints" / name
    wait_for(run / "last.ckpt", proc)  # epoch 0 is done: the persistent loader workers are up
    deadline = time.monotonic() + 60
    while len(workers := live_children(proc.pid)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "no loader workers"
        time.sleep(0.05)
    proc.kill()  # kill -9 of the fit alone, as the OOM killer or a scheduler does: its workers live on
    proc.wait()
    assert runs.fit_run_name(name, "last") == name  # at once, not refused for the dead process
    assert any(map(is_running, workers))  # (they notice the parent is gone within 5 s)
    runs.unlock_run(name)
    epochs = torch.load(run / "last.ckpt", weights_only=True)["epoch"] + 2
    resume = fast_args(
        shapes_root, f"--name={name}", SMALL, "--ckpt_path=last", f"--trainer.max_epochs={epochs}"
    )
    assert run_cli("fit", *resume) == 0
    assert torch.load(run / "last.ckpt", weights_only=True)["epoch"] == epochs - 1


def test_lightnings_own_sigterm_stop_ends_with_the_run_block_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM landing between GracefulStop's batch-end check and Lightning's own raises Lightning's
    SIGTERMException rather than Interrupted (seen under load): the run's block is printed all the same."""
    printed = []
    monkeypatch.setattr(RunSummary, "_print", lambda self, trainer, how: printed.append(how))
    for exception in (Interrupted(143), SIGTERMException(143), ValueError("a bug, not a stop")):
        RunSummary().on_exception(None, None, exception)
    assert printed == ["stopped (exit status 143)"] * 2
