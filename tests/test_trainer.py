"""project.trainer.Trainer: a full disk under the logs ends in one line, the checkpoints intact; options
it refuses before a run starts."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch
from tensorboard.summary.writer import record_writer

from project.errors import UserError
from project.trainer import Trainer
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


def test_16_mixed_on_the_cpu_says_it_runs_bf16(caplog: pytest.LogCaptureFixture) -> None:
    """Every run says so, not only the first of a process (Lightning's own warning shows once)."""
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            trainer = Trainer(accelerator="cpu", precision="16-mixed", logger=False)
            assert trainer.precision == "bf16-mixed"
        Trainer(accelerator="cpu", precision="bf16-mixed", logger=False)
    line = "Precision: 16-mixed (float16) has no autocast on the CPU; this run uses bf16-mixed (bfloat16)"
    assert caplog.text.count(line) == 2


@pytest.mark.slow
def test_running_out_of_memory_mid_run_is_one_message_and_the_last_checkpoint_is_kept(tmp_path: Path) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from project.errors import UserError
    from tests.helpers import TensorData

    class Greedy(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 2)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
            if self.global_step == 2:
                torch.empty(2**60, dtype=torch.uint8)  # the CPU allocator refuses it, as a full GPU would
            images, labels = batch
            return torch.nn.functional.cross_entropy(self.linear(images), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    every_step = ModelCheckpoint(tmp_path, every_n_train_steps=1, save_last=True)
    trainer = Trainer(
        max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[every_step], default_root_dir=tmp_path, accelerator="cpu",
    )  # fmt: skip
    data = TensorData(torch.randn(64, 3), torch.randint(0, 2, (64,)), batch_size=8)
    with pytest.raises(
        UserError, match=r"Out of memory at step 2 \(epoch 0\) with --data\.batch_size=8 on cpu"
    ) as e:
        trainer.fit(Greedy(), data)
    assert "--trainer.accumulate_grad_batches=2" in str(e.value) and "--ckpt_path last" in str(e.value)
    assert "batch_size_find" in str(e.value)  # room: tuning
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 2


@pytest.mark.slow
def test_a_loader_worker_stuck_on_a_file_is_named_after_the_timeout(
    shapes_root: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    from project.data import dataset

    stuck = sorted((shapes_root / "train" / "star").glob("*.jpg"))[2]
    real = dataset.load_rgb

    def hangs_on_one_file(path: Path) -> torch.Tensor:
        while Path(path) == stuck:  # a read that never returns, as on a stuck network mount
            time.sleep(1)
        return real(path)

    monkeypatch.setattr(dataset, "load_rgb", hangs_on_one_file)  # forked loader workers inherit it
    args = fast_args(
        shapes_root,
        "--data.num_workers=2",
        "--data.loader_timeout=3",
        "--data.cache=false",  # room: cache
    )
    started = time.monotonic()
    assert run_cli("fit", *args) == 2
    assert time.monotonic() - started < 60
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: The data loader delivered no batch for 3 seconds")
    assert f"'{stuck}'" in err[0] and "worker" in err[0] and "--data.loader_timeout" in err[0]


def test_sync_batchnorm_on_cpu_processes_is_one_message() -> None:
    with pytest.raises(UserError) as error:
        Trainer(accelerator="cpu", devices=2, strategy="ddp", sync_batchnorm=True, logger=False)
    assert str(error.value).startswith(
        "--trainer.sync_batchnorm=true needs GPUs: torch's SyncBatchNorm does not run in CPU processes "
        "(this run: 2 CPU process(es), strategy DDPStrategy)."
    )
    assert "Fix: drop --trainer.sync_batchnorm" in str(error.value)
