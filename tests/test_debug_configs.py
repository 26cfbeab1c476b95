"""The debugging presets in configs/presets/ do what their comments promise, and seeded runs repeat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project import runs
from project.errors import UserError
from tests.helpers import fast_args, run_cli

pytestmark = pytest.mark.slow  # every test here trains or starts a server

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "presets"


def preset(name: str, root: Path, *extra: str) -> list[str]:
    """`--config configs/presets/<name>.yaml` plus the fast flags, minus those the preset sets itself."""
    own = ("--trainer.max_epochs", "--model.scheduler")
    flags = [f for f in fast_args(root) if not f.startswith(own)]
    return ["--config", str(CONFIGS / f"{name}.yaml"), *flags, *extra]


def scalars(log_dir: Path, tag: str) -> list[float]:
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [e.value for e in events.Scalars(tag)]


def test_overfit_drives_the_loss_near_zero(workdir: Path, shapes_root: Path) -> None:
    assert run_cli("fit", *preset("overfit", shapes_root, "--name=o")) == 0
    losses = scalars(workdir / "logs" / "o", "train/loss")
    assert len(losses) == 60  # 2 batches x 30 epochs, every step logged
    assert losses[0] > 1.0 and max(losses[-4:]) < 0.05


def test_profiler_writes_a_trace_into_the_run(workdir: Path, shapes_root: Path) -> None:
    assert run_cli("fit", *preset("profiler", shapes_root, "--name=p")) == 0
    traces = list((workdir / "logs" / "p").rglob("*.pt.trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("ProfilerStep#") for e in events)
    assert any("aten::convolution" in e.get("name", "") for e in events)


def test_anomaly_detection_names_the_op(workdir: Path, shapes_root: Path) -> None:
    diverge = ("--model.optimizer=torch.optim.SGD", "--model.optimizer.init_args.lr=1e30")
    with pytest.raises(RuntimeError, match=r"Function '\w+' returned nan values"):
        run_cli("fit", *preset("anomaly", shapes_root, *diverge))


def test_limited_runs_part_of_the_data(workdir: Path, shapes_root: Path) -> None:
    tiny = ("--name=l", "--trainer.limit_train_batches=0.5", "--trainer.limit_val_batches=0.5")
    assert run_cli("fit", *preset("limited", shapes_root, *tiny)) == 0
    checkpoint = torch.load(workdir / "checkpoints" / "l" / "last.ckpt", weights_only=False)
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (1, 2)  # 2 epochs x 1 of 3 batches


def last_weights(workdir: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(workdir / "checkpoints" / name / "last.ckpt", weights_only=False)["state_dict"]


def test_two_seeded_runs_are_identical(workdir: Path, shapes_root: Path) -> None:
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        args = fast_args(shapes_root, f"--name={name}", f"--seed_everything={seed}", "--data.num_workers=2")
        assert run_cli("fit", *args, "--trainer.max_epochs=2") == 0
    a, b, c = (last_weights(workdir, n) for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)  # the seed matters: the comparison can fail
    for tag in ("train/loss", "val/loss", "val/acc"):
        assert scalars(workdir / "logs" / "a", tag) == scalars(workdir / "logs" / "b", tag)


def test_debug_writes_nothing_and_is_never_resumed(workdir: Path, shapes_root: Path) -> None:
    flags = [f for f in preset("debug", shapes_root) if f != "--export_best.enabled=false"]  # its own switch
    assert run_cli("fit", *flags, "--name=d") == 0
    written = [str(p.relative_to(workdir)) for p in workdir.rglob("*") if p.is_file()]
    assert written == []  # no checkpoint, log, config, export or lock file
    assert run_cli("fit", *flags) == 0  # a time-stamped debug run: the same
    assert [p for p in workdir.rglob("*") if p.is_file()] == []
    with pytest.raises(UserError, match="there is no run to resume"):
        runs.fit_run_name(None, "last")  # `--ckpt_path last` never picks a debug run


def test_early_stopping_adds_its_callback_and_keeps_the_templates(workdir: Path, shapes_root: Path) -> None:
    """A preset's trainer.callbacks adds to the template's callbacks (cli.CALLBACKS), never replaces them."""
    assert run_cli("fit", *preset("early_stopping", shapes_root, "--name=e", "--trainer.max_epochs=1")) == 0
    checkpoint = torch.load(workdir / "checkpoints" / "e" / "last.ckpt", weights_only=True)
    kept = {key.split("{")[0] for key in checkpoint["callbacks"]}
    assert {"EarlyStopping", "ModelCheckpoint", "RNGState"} <= kept, kept
    assert len(scalars(workdir / "logs" / "e", "lr-AdamW/pg1")) == 3  # the learning-rate monitor, every step
