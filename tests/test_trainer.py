"""project.trainer.Trainer: a full disk under the logs ends in one line, the checkpoints intact."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from tensorboard.summary.writer import record_writer

from tests.helpers import fast_args, run_cli


def test_full_log_disk_ends_in_one_line_and_keeps_checkpoints(
    workdir: Path, shapes_root: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """TensorBoard's writer thread meets ENOSPC once the first checkpoint exists."""
    checkpoints = workdir / "checkpoints" / "full"
    write = record_writer.RecordWriter.write

    def full_after_first_checkpoint(self: record_writer.RecordWriter, data: bytes) -> None:
        if list(checkpoints.glob("*.ckpt")):
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", full_after_first_checkpoint)
    assert run_cli("fit", *fast_args(shapes_root, "--name=full", "--trainer.max_epochs=3")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        "error: No space left on the disk (No space left on device) while writing the run's logs"
    )
    assert f"`fit` stopped. The checkpoints already written (2 in '{checkpoints}') are intact." in last
    assert last.endswith("then resume with --name full --ckpt_path last.")
    for path in checkpoints.glob("*.ckpt"):
        assert "state_dict" in torch.load(path, weights_only=True)
