"""`python -m project doctor`: versions, devices, data loading and folders; exit 1 with fixes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from project import doctor
from project.data.datamodule import MAX_WORKERS_PER_CORE, usable_cores


def run_doctor(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "project", "doctor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_healthy_machine(tmp_path: Path) -> None:
    result = run_doctor(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for package in doctor.PACKAGES:
        assert f"\n  {package:<14} " in out
    assert "matmul ok (relative error" in out and "bf16 " in out
    assert "DataLoader     2 workers started and delivered 8 samples" in out
    assert "  logs/          writable, " in out and "  checkpoints/   writable, " in out
    assert out.rstrip().endswith("All checks passed.")


def test_checkpoints_that_is_not_a_folder(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").write_text("oops")
    result = run_doctor(tmp_path)
    assert result.returncode == 1
    assert "1 problem(s):" in result.stdout
    assert "'checkpoints' is a file, not a folder. Fix: move it away" in result.stdout


def test_unwritable_checkpoint_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
    else:  # root writes through permission bits: refuse the write the way a read-only mount would
        real = doctor.tempfile.NamedTemporaryFile

        def refuse(*args, dir=None, **kwargs):
            if Path(dir) == folder:
                raise PermissionError(13, "Permission denied", str(folder))
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(doctor.tempfile, "NamedTemporaryFile", refuse)
    with pytest.raises(SystemExit) as exit_info:
        doctor.main(["--folders", str(tmp_path / "logs"), str(folder), "--workers", "0"])
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert f"'{folder}' is not writable: runs could not save {folder}. Fix: chmod u+w" in out
    assert "1 problem(s):" in out


def test_low_disk_is_a_problem(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        doctor.main(["--folders", str(tmp_path), "--min_free_gb", "1e9", "--workers", "0"])
    assert "GiB free for" in capsys.readouterr().out


@pytest.mark.parametrize("workers", ["100000", "-1"])
def test_workers_beyond_the_data_modules_bound_start_none(
    workers: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Each worker is a process: 100,000 of them exhausted memory, so the bound is --data.num_workers'."""

    def no_loader(*args, **kwargs):
        raise AssertionError("a DataLoader was built for an out-of-range --workers")

    monkeypatch.setattr(doctor, "DataLoader", no_loader)  # even on a failure, nothing is forked
    with pytest.raises(SystemExit) as exit_info:
        doctor.main(["--workers", workers, "--folders", "."])
    assert exit_info.value.code == 2
    most = MAX_WORKERS_PER_CORE * usable_cores()
    err = capsys.readouterr().err
    assert err.startswith(f"error: --workers {workers} is not a number of DataLoader workers")
    assert f"it must be from 0 to {most} ({MAX_WORKERS_PER_CORE} per CPU core" in err
    assert " Fix: pass e.g. --workers 2" in err and len(err.splitlines()) == 1


def test_folder_names_are_printed_with_their_control_characters_escaped(tmp_path: Path, capsys) -> None:
    """A folder name is the user's text: `\\e]0;owned\\a` set the terminal's title when printed raw."""
    folder = tmp_path / "logs\x1b]0;owned\x07"
    afile = tmp_path / "ckpt\x1b[2J"
    afile.write_text("")
    with pytest.raises(SystemExit):
        doctor.main(["--folders", str(folder), str(afile), "--workers", "0", "--min_free_gb", "0"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert f"  {tmp_path}/logs\\x1b]0;owned\\x07/ writable, " in out
    assert f"'{tmp_path}/ckpt\\x1b[2J' is a file, not a folder. Fix: move it away" in out
