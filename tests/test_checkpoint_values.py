"""What commands take from a checkpoint: the run's settings as data, never code, on any machine."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.serialization
import yaml

from project.cli import ProjectCLI
from tests.helpers import fast_args, run_cli, write_image

pytestmark = pytest.mark.slow  # every test here trains or starts a server


@pytest.fixture(scope="module")
def run(shapes_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A working folder holding one trained run, `r`, at 32 px (default.yaml says 64)."""
    work = tmp_path_factory.mktemp("work")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        assert run_cli("fit", *fast_args(shapes_root, "--name=r")) == 0
        yield work


@pytest.fixture
def inside(run: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(run)
    return run


def best(run: Path) -> Path:
    return next((run / "checkpoints" / "r").glob("epoch=*.ckpt"))


def tampered(run: Path, name: str, section: str, key: str, value: object) -> Path:
    """A copy of the best checkpoint with `checkpoint[section][key] = value`, weights-only loadable."""
    checkpoint = torch.load(best(run), weights_only=True)
    checkpoint[section][key] = value
    path = run / "checkpoints" / "r" / name
    torch.save(checkpoint, path)
    return path


def gpu_tagged(source: Path, path: Path) -> Path:
    """`source` re-saved as a GPU machine writes it: every tensor's storage tagged `cuda:0`."""
    checkpoint = torch.load(source, weights_only=True)
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: "cuda:0"):
        torch.save(checkpoint, path)
    return path


def system_call(marker: Path) -> dict:
    return {"class_path": "os.system", "init_args": {"command": f"touch {marker}"}}


SGD = {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.3, "momentum": 0.9}}
COMMANDS = {
    "fit": ["--trainer.max_epochs=2", "--data.root={root}", "--data.image_size=32", "--name=fit-{key}"],
    "validate": [],
    "test": [],
    "predict": ["--data.predict_dir={images}"],
    "export": [],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("hyper_parameters", "optimizer"),
        ("hyper_parameters", "scheduler"),
        ("hyper_parameters", "backbone"),
        ("hyper_parameters", "class_names"),
        ("datamodule_hyper_parameters", "root"),
    ],
)
def test_a_class_path_in_a_checkpoint_is_never_imported(
    inside: Path, shapes_root: Path, capsys, command: str, section: str, key: str
) -> None:
    marker = inside / f"ran-{command}-{key}"
    path = tampered(inside, f"evil-{key}.ckpt", section, key, system_call(marker))
    extra = [a.format(images=shapes_root / "val", root=shapes_root, key=key) for a in COMMANDS[command]]
    status = run_cli(
        command, f"--ckpt_path={path}", "--data.num_workers=0", "--export_best.enabled=false", *extra
    )
    err = capsys.readouterr().err
    assert not marker.exists()
    if key in ("optimizer", "scheduler") and command != "fit":
        assert status == 0  # evaluation never reads the optimizer
    else:
        assert status == 2
        assert re.search(rf"error: Refused checkpoint '.*evil-{key}.ckpt': its setting '{key}", err)
        assert "Nothing from it was imported or run" in err and "Traceback" not in err


def test_an_instantiator_in_a_checkpoint_is_ignored(inside: Path) -> None:
    marker = inside / "ran-instantiator"
    path = tampered(inside, "evil-inst.ckpt", "hyper_parameters", "_instantiator", "os.system")
    assert run_cli("validate", f"--ckpt_path={path}", "--data.num_workers=0") == 0
    assert not marker.exists()


def test_resume_keeps_an_allowed_optimizer(inside: Path, capsys) -> None:
    """The checkpoint's optimizer and schedule are taken for fit when they are torch's or ours."""
    path = tampered(inside, "sgd.ckpt", "hyper_parameters", "optimizer", SGD)
    optimizer = printed_config(capsys, "fit", f"--ckpt_path={path}")["model"]["optimizer"]
    assert optimizer["class_path"] == "torch.optim.SGD" and optimizer["init_args"]["lr"] == 0.3
    optimizer = printed_config(capsys, "fit", f"--ckpt_path={path}", "--model.optimizer.lr=0.1")["model"][
        "optimizer"
    ]
    assert optimizer["init_args"]["lr"] == 0.1  # the command line still wins


def printed_config(capsys, *args: str) -> dict:
    assert run_cli(*args, "--print_config") == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_evaluation_takes_the_runs_data_settings_and_flags_override_them(
    inside: Path, shapes_root: Path, capsys
) -> None:
    for command in ("validate", "test", "predict", "export"):
        config = printed_config(capsys, command, f"--ckpt_path={best(inside)}")
        assert config["data"]["root"] == str(shapes_root)
        assert config["data"]["image_size"] == config["model"]["image_size"] == 32  # default.yaml: null
        assert config["data"]["batch_size"] == 16 and config["model"]["backbone"] == "resnet18"
    config = printed_config(capsys, "validate", f"--ckpt_path={best(inside)}", "--data.batch_size=5")
    assert config["data"]["batch_size"] == 5


def test_validate_with_only_the_checkpoint_reproduces_the_runs_metric(inside: Path) -> None:
    path = best(inside)
    cli = ProjectCLI(args=["validate", f"--ckpt_path={path}", "--data.num_workers=0"])
    saved = float(re.search(r"val_acc=([0-9.]+)\.ckpt", path.name).group(1))
    assert round(float(cli.trainer.callback_metrics["val/acc"]), 4) == saved


def test_validate_on_other_classes_is_one_message(inside: Path, tmp_path: Path, capsys) -> None:
    other = tmp_path / "other"
    for split in ("train", "val"):
        for name in ("apple", "pear"):
            write_image(other / split / name / "a.png")
    status = run_cli(
        "validate", f"--ckpt_path={best(inside)}", f"--data.root={other}", "--data.num_workers=0"
    )
    err = capsys.readouterr().err
    assert status == 2
    assert re.search(
        r"error: The model was trained on classes \['circle'.*but '.*other' has \['apple', 'pear'\]", err
    )


def test_last_names_the_runs_last_checkpoint_outside_fit(inside: Path, capsys) -> None:
    config = printed_config(capsys, "validate", "--ckpt_path=last", "--name=r")
    assert config["data"]["image_size"] == 32


def test_resume_takes_the_runs_data_settings_and_refuses_other_classes(
    inside: Path, shapes_root: Path, tmp_path: Path, capsys
) -> None:
    """Resumed with the data of the command line (the embedded shapes when it names none), a run trained
    on a folder of 2 classes ended in PyTorch's `size mismatch for net.fc.weight`, or trained on other
    data of the same number of classes."""
    config = printed_config(capsys, "fit", f"--ckpt_path={best(inside)}")
    assert config["data"]["root"] == str(shapes_root)
    assert config["data"]["image_size"] == 32 and config["data"]["batch_size"] == 16
    config = printed_config(capsys, "fit", "--ckpt_path=last", "--name=r", "--data.batch_size=5")
    assert (config["data"]["root"], config["data"]["batch_size"]) == (str(shapes_root), 5)  # flags win

    copy = tmp_path / "elsewhere.ckpt"  # resumed as a run of its own: the module's run `r` stays as it is
    copy.write_bytes(best(inside).read_bytes())
    quick = ["--data.num_workers=0", "--export_best.enabled=false", "--trainer.enable_progress_bar=false"]
    assert run_cli("fit", f"--ckpt_path={copy}", "--name=resumed", "--trainer.max_epochs=2", *quick) == 0
    assert not (inside / "data").exists()  # the embedded shapes were never made: the run's own data
    resumed = yaml.safe_load((inside / "logs" / "resumed" / "config.yaml").read_text())
    assert resumed["data"]["root"] == str(shapes_root)

    two = tmp_path / "two"
    for split in ("train", "val"):
        for name in ("circle", "square"):
            shutil.copytree(shapes_root / split / name, two / split / name)
    capsys.readouterr()
    assert run_cli("fit", f"--ckpt_path={copy}", "--name=other", f"--data.root={two}", *quick) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: Checkpoint '{copy}' was trained on classes ['circle', ")
    assert f"but the data to resume on ('{two}') has ['circle', 'square']. Fix: " in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (inside / "logs" / "other").exists()


@pytest.mark.parametrize("command", ["validate", "test", "predict", "fit"])
def test_a_gpu_written_checkpoint_runs_every_command_on_cpu(
    inside: Path, shapes_root: Path, command: str
) -> None:
    path = gpu_tagged(inside / "checkpoints" / "r" / "last.ckpt", inside / f"gpu-{command}.ckpt")
    with pytest.raises(RuntimeError, match="CUDA"):  # the copy is what a GPU machine writes
        torch.load(path, weights_only=True)
    extra = {
        "predict": [f"--data.predict_dir={shapes_root / 'val'}", f"--predictions.output={inside / 'p.csv'}"],
        "fit": [f"--name=gpu-{command}", *fast_args(shapes_root, "--trainer.max_epochs=2")],
    }.get(command, [])
    assert run_cli(command, f"--ckpt_path={path}", "--data.num_workers=0", *extra) == 0
