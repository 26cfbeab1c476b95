"""Run names: two fits of one run cannot run at once; a killed fit leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import project
from project import runs
from project.errors import UserError
from tests.helpers import fast_args, run_cli

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
    # resuming reads the run's settings from it first
    torch.save({"pytorch-lightning_version": "2.6.0", "state_dict": {}, "hyper_parameters": {}}, last)
    before = last.read_bytes()
    other = holder("r")
    assert run_cli("fit", *fast_args(shapes_root, "--name=r", "--ckpt_path=last")) == 2
    assert f"Run 'r' is being written by process {other.pid}" in capsys.readouterr().err
    assert last.read_bytes() == before  # untouched


def test_two_new_runs_in_the_same_second_get_different_names(workdir: Path, holder, monkeypatch) -> None:
    monkeypatch.setattr(time, "strftime", lambda *args: "20260101-000000")
    holder("20260101-000000")
    assert runs.new_run_name() == "20260101-000000-1"


HOLD_AND_FORK = """
import os, sys, time
from project.runs import lock_run
lock_run(sys.argv[1])
child = os.fork()  # as a DataLoader starts its workers
if child == 0:
    time.sleep(600)
    os._exit(0)
print(child, flush=True)
time.sleep(600)
"""


def test_the_lock_is_not_shared_with_forked_children(workdir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(project.__file__).resolve().parents[1])}
    parent = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_FORK, "forked"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline())
    try:
        with pytest.raises(UserError, match=f"Run 'forked' is being written by process {parent.pid} on "):
            runs.lock_run("forked")  # a second live process is refused
        parent.send_signal(signal.SIGKILL)  # the child lives on, as loader workers outlive a killed fit
        parent.wait()
        os.kill(child, 0)  # still running
        runs.lock_run("forked")  # free at once all the same
        assert f"process {os.getpid()} on " in (workdir / "logs" / "forked" / ".lock").read_text()
    finally:
        runs.unlock_run("forked")
        os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize(
    "name",
    ["../../outside", "/tmp/absolute-run", "a/../b", "a/b/c", "a//b", "a/", "a\\b", "..", ".", "", "a\0b"],
)
def test_a_run_name_is_one_folder_name(workdir: Path, name: str) -> None:
    with pytest.raises(UserError, match=r"^--name=.* is not a run name: it must be a folder name") as e:
        runs.fit_run_name(name, None)
    assert f"--name={name!r}" in str(e.value) and " Fix: pick a plain name such as --name=" in str(e.value)
    with pytest.raises(UserError, match="is not a run name"):
        runs.eval_run_name(name, "checkpoints/r/last.ckpt")


def test_a_group_of_runs_stays_inside_the_project(workdir: Path) -> None:
    """`group/run` (a sweep's trials): found again from its checkpoint, and as the newest run."""
    assert runs.fit_run_name("study/trial-0001", None) == "study/trial-0001"
    last = workdir / "checkpoints" / "study" / "trial-0001" / "last.ckpt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"a checkpoint")
    assert runs.run_of_checkpoint(str(last)) == "study/trial-0001"
    assert runs.newest_run() == "study/trial-0001"


@pytest.mark.parametrize("name", ["../../outside", "ABSOLUTE"])
def test_a_run_name_out_of_the_project_writes_nothing(
    workdir: Path, shapes_root: Path, name: str, capsys
) -> None:
    absolute = workdir.parent / "absolute"
    name = name.replace("ABSOLUTE", str(absolute))
    assert run_cli("fit", *fast_args(shapes_root, f"--name={name}")) == 2
    err = capsys.readouterr().err
    assert f"error: --name={name!r} is not a run name" in err and "Fix: pick a plain name" in err
    assert list(workdir.iterdir()) == []  # nothing written, inside or outside the project
    assert not (workdir.parent / "outside").exists() and not absolute.exists()  # logs/../../outside


def test_a_refused_existing_name_leaves_nothing_behind(workdir: Path, shapes_root: Path, capsys) -> None:
    old = workdir / "checkpoints" / "old" / "epoch=000-val_acc=0.5000.ckpt"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"a checkpoint")
    logged = workdir / "logs" / "logged" / "events.out"
    logged.parent.mkdir(parents=True)
    logged.write_bytes(b"events")
    for name in ("old", "logged"):
        assert run_cli("fit", *fast_args(shapes_root, f"--name={name}")) == 2
        assert f"Run '{name}' already exists" in capsys.readouterr().err
    assert sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*")) == [
        "checkpoints",
        "checkpoints/old",
        "checkpoints/old/epoch=000-val_acc=0.5000.ckpt",
        "logs",
        "logs/logged",
        "logs/logged/events.out",
    ]


@pytest.mark.parametrize("name", ["--name=never", None])
def test_a_fit_refused_at_start_leaves_no_run_behind(workdir: Path, tmp_path: Path, capsys, name) -> None:
    """Before: `logs/<name>/.lock` in an otherwise empty folder, which `report` then listed as a run."""
    flags = [f"--data.root={tmp_path / 'missing'}", *([name] if name else [])]
    assert run_cli("fit", *flags) == 2
    assert "error: Data folder" in capsys.readouterr().err
    assert list((workdir / "logs").iterdir()) == []
    assert not (workdir / "checkpoints").exists() or list((workdir / "checkpoints").iterdir()) == []
    assert runs.fit_run_name("never", None) == "never"  # the name is free for the corrected command
