"""Run names: two fits of one run cannot run at once; a killed fit leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import project
from project import runs
from tests.conftest import fast_args, run_cli

HOLD = """
import sys, time
from project.runs import lock_run
lock_run(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def hold_lock(workdir: Path, name: str) -> subprocess.Popen:
    """Another process (as a second fit would be) that holds run `name`."""
    src = str(Path(project.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, name], cwd=workdir, env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.fixture
def holder(workdir: Path):
    procs: list[subprocess.Popen] = []
    yield lambda name: procs.append(hold_lock(workdir, name)) or procs[-1]
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_run_in_use_is_refused_by_name_and_freed_when_its_process_dies(
    workdir: Path, shapes_root: Path, holder, capsys
) -> None:
    other = holder("busy")
    assert run_cli("fit", *fast_args(shapes_root, "--name=busy")) == 2
    err = capsys.readouterr().err
    assert f"error: Run 'busy' is being written by process {other.pid} on " in err
    assert "wait for that fit to end" in err
    assert not (workdir / "checkpoints" / "busy").exists()
    other.send_signal(signal.SIGKILL)  # a crash: the kernel drops its lock, nothing stale is left
    other.wait()
    assert runs.fit_run_name("busy", None) == "busy"  # what fit calls first: the run is free again


def test_resuming_a_run_in_use_is_refused(workdir: Path, shapes_root: Path, holder, capsys) -> None:
    last = workdir / "checkpoints" / "r" / "last.ckpt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"a checkpoint")
    other = holder("r")
    assert run_cli("fit", *fast_args(shapes_root, "--name=r", "--ckpt_path=last")) == 2
    assert f"Run 'r' is being written by process {other.pid}" in capsys.readouterr().err
    assert last.read_bytes() == b"a checkpoint"  # untouched


def test_two_new_runs_in_the_same_second_get_different_names(workdir: Path, holder, monkeypatch) -> None:
    monkeypatch.setattr(time, "strftime", lambda *args: "20260101-000000")
    holder("20260101-000000")
    assert runs.new_run_name() == "20260101-000000-1"
