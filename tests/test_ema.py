"""--ema.decay: validation, checkpoints and evaluation see the averaged weights; a resume continues them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from project.callbacks import EMA
from project.cli import ProjectCLI
from project.errors import UserError
from tests.helpers import fast_args, run_cli


def saved(checkpoint: Path) -> dict:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)


def selection_score(checkpoint: dict) -> float:
    (state,) = [s for key, s in checkpoint["callbacks"].items() if key.startswith("ModelCheckpoint")]
    return float(state["current_score"])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, shapes_root: Path) -> Path:
    """2 epochs of 3 steps with an EMA, then 1 more epoch resumed from last.ckpt: the work folder."""
    work = tmp_path_factory.mktemp("ema")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        args = fast_args(shapes_root, "--name=ema", "--ema.decay=0.9", "--trainer.max_epochs=2")
        assert run_cli("fit", *args) == 0
        (work / "two-epochs.ckpt").write_bytes((work / "checkpoints/ema/last.ckpt").read_bytes())
        assert run_cli("fit", *args, "--trainer.max_epochs=3", "--ckpt_path=last") == 0
    return work


@pytest.mark.slow
def test_checkpoints_hold_the_average_and_the_training_weights(run: Path) -> None:
    checkpoint = saved(run / "two-epochs.ckpt")
    average, current = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert int(checkpoint["averaging_state"]["n_averaged"]) == checkpoint["global_step"] == 6
    assert not torch.equal(average["net.fc.weight"], current["net.fc.weight"])
    assert not torch.equal(average["net.bn1.running_mean"], current["net.bn1.running_mean"])  # use_buffers
    # the best val/acc so far is the run's, not the copy's made before the first validation
    assert torch.equal(average["val_acc_best.max_value"], current["val_acc_best.max_value"])
    assert float(average["val_acc_best.max_value"]) >= selection_score(checkpoint)


@pytest.mark.slow
def test_validate_of_the_best_checkpoint_reproduces_selection(run: Path, monkeypatch) -> None:
    monkeypatch.chdir(run)
    (best,) = sorted((run / "checkpoints/ema").glob("epoch=*.ckpt"))[-1:]
    score = selection_score(saved(best))
    cli = ProjectCLI(args=["validate", f"--ckpt_path={best}", "--data.num_workers=0"])
    measured = float(cli.trainer.callback_metrics["val/acc"])
    assert measured == score  # exactly: the averaged weights selection judged
    assert f"{measured:.4f}" == re.search(r"val_acc=(\d\.\d{4})", best.name).group(1)


@pytest.mark.slow
def test_a_resumed_run_continues_the_average(run: Path) -> None:
    before, after = saved(run / "two-epochs.ckpt"), saved(run / "checkpoints/ema/last.ckpt")
    assert int(after["averaging_state"]["n_averaged"]) == after["global_step"] == 9  # 6 + 3, not a new start
    assert not torch.equal(before["state_dict"]["net.fc.weight"], after["state_dict"]["net.fc.weight"])


def test_no_decay_no_averaging(tmp_path: Path) -> None:
    assert EMA().state_dict() == {}
    with pytest.raises(UserError, match=r"--ema.decay=1.5 is out of range"):
        EMA(decay=1.5)
