"""End to end through `python -m project ...` (in process), on tiny generated data."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

from project.cli import ProjectCLI
from project.data.decode import load_rgb
from project.data.shapes import CLASSES
from project.data.transforms import eval_transform
from project.model import ImageClassifier
from tests.helpers import fast_args, run_cli, scalar_tags, write_image


@pytest.mark.slow
def test_fit_writes_logs_checkpoints_and_config(workdir: Path, shapes_root: Path) -> None:
    assert run_cli("fit", *fast_args(shapes_root, "--name=first", "--trainer.max_epochs=2")) == 0
    logs = workdir / "logs" / "first"
    assert (logs / "config.yaml").is_file() and list(logs.glob("events.out.tfevents.*"))
    assert not (logs / ".lock").exists()  # given back as the fit ended
    tags = scalar_tags(logs)
    expected = {
        "train/loss",
        "train/acc",
        "val/loss",
        "val/acc",
        "val/acc_best",
        "val/f1_macro",
        "val/top5_acc",
    }
    assert expected <= tags
    assert any(tag.startswith("lr-AdamW") for tag in tags)
    files = sorted(p.name for p in (workdir / "checkpoints" / "first").iterdir())
    assert [f for f in files if f != "last.ckpt"] == [
        f for f in files if re.fullmatch(r"epoch=00[01]-val_acc=0\.\d{4}\.ckpt", f)
    ]
    assert len(files) == 3 and "last.ckpt" in files
    checkpoint = torch.load(workdir / "checkpoints" / "first" / "last.ckpt", weights_only=False)
    assert checkpoint["hyper_parameters"]["class_names"] == list(CLASSES)
    assert checkpoint["hyper_parameters"]["num_classes"] == 6
    assert checkpoint["hyper_parameters"]["image_size"] == 32


@pytest.mark.slow
def test_resume_continues_epoch_step_optimizer_and_schedule(workdir: Path, shapes_root: Path) -> None:
    assert run_cli("fit", *fast_args(shapes_root, "--name=r")) == 0
    first = torch.load(workdir / "checkpoints" / "r" / "last.ckpt", weights_only=False)
    assert (first["epoch"], first["global_step"]) == (0, 3)  # 48 images / 16 per batch
    assert (
        run_cli("fit", *fast_args(shapes_root, "--name=r", "--ckpt_path=last", "--trainer.max_epochs=2")) == 0
    )
    resumed = torch.load(workdir / "checkpoints" / "r" / "last.ckpt", weights_only=False)
    assert (resumed["epoch"], resumed["global_step"]) == (1, 6)
    assert resumed["optimizer_states"][0]["state"][0]["step"].item() == 6  # AdamW moments carried over
    assert resumed["lr_schedulers"][0]["last_epoch"] == 6
    assert "total_steps" not in resumed["lr_schedulers"][0]  # re-derived from the resumed run's length
    explicit = [f"--ckpt_path={workdir / 'checkpoints' / 'r' / 'last.ckpt'}", "--trainer.max_epochs=3"]
    assert run_cli("fit", *fast_args(shapes_root, *explicit)) == 0  # a file in checkpoints/r continues run r
    assert torch.load(workdir / "checkpoints" / "r" / "last.ckpt", weights_only=False)["epoch"] == 2
    assert sorted(p.name for p in (workdir / "logs").iterdir()) == ["r"]


@pytest.mark.slow
def test_a_new_run_never_overwrites_an_old_one(workdir: Path, shapes_root: Path, capsys) -> None:
    assert run_cli("fit", *fast_args(shapes_root, "--name=same", "--trainer.limit_train_batches=1")) == 0
    assert run_cli("fit", *fast_args(shapes_root, "--name=same")) == 2
    assert "Run 'same' already exists" in capsys.readouterr().err
    assert run_cli("fit", *fast_args(shapes_root, "--trainer.limit_train_batches=1")) == 0
    assert run_cli("fit", *fast_args(shapes_root, "--trainer.limit_train_batches=1")) == 0
    assert len(list((workdir / "checkpoints").iterdir())) == 3


@pytest.mark.slow
def test_val_split_from_one_folder(workdir: Path, flat_root: Path) -> None:
    assert run_cli("fit", *fast_args(flat_root, "--name=flat", "--data.val_split=0.25")) == 0
    assert (workdir / "checkpoints" / "flat" / "last.ckpt").is_file()


@pytest.mark.slow
def test_validate_test_and_predict_from_a_checkpoint(
    workdir: Path, shapes_root: Path, tmp_path: Path
) -> None:
    assert run_cli("fit", *fast_args(shapes_root, "--name=p")) == 0
    ckpt = workdir / "checkpoints" / "p" / "last.ckpt"
    common = [f"--ckpt_path={ckpt}", f"--data.root={shapes_root}", "--data.num_workers=0"]
    assert run_cli("validate", *common) == 0
    assert run_cli("test", *common) == 0
    assert {"test/acc", "test/loss"} <= scalar_tags(workdir / "logs" / "p" / "test")
    assert "test/acc" not in scalar_tags(workdir / "logs" / "p")  # the fit's own run stays the fit's
    assert (workdir / "logs" / "p" / "config.yaml").is_file() and (
        workdir / "logs" / "p" / "test" / "test-config.yaml"
    ).is_file()

    images = tmp_path / "incoming"
    sources = sorted((shapes_root / "val").rglob("*.jpg"))[::5]
    for i, src in enumerate(sources):
        (images / f"batch{i % 2}").mkdir(parents=True, exist_ok=True)
        (images / f"batch{i % 2}" / f"IMG_{i}.JPG").write_bytes(src.read_bytes())
    (images / "notes.txt").write_text("not an image")
    out = tmp_path / "out" / "predictions.csv"
    args = [
        f"--ckpt_path={ckpt}",
        f"--data.predict_dir={images}",
        f"--predictions.output={out}",
        "--data.num_workers=0",
    ]
    # no --data.root: predict needs nothing but the checkpoint and the images
    assert run_cli("predict", *args, "--predictions.top_k=3") == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    columns = ["file", "class_name", "probability"]
    columns += [f"top{k}_{c}" for k in (1, 2, 3) for c in ("class", "probability")]
    columns.append("reason")  # room: unknown
    assert list(rows[0]) == columns
    assert sorted(r["file"] for r in rows) == sorted(f"batch{i % 2}/IMG_{i}.JPG" for i in range(len(sources)))

    checkpoint = torch.load(ckpt, weights_only=False)
    model = ImageClassifier(num_classes=6, backbone="resnet18", scheduler=None)
    model.load_state_dict(checkpoint["state_dict"])
    model.eval()
    for row in rows:
        image = eval_transform(32)(load_rgb(images / row["file"]))
        with torch.no_grad():
            probs = model(image[None]).softmax(1)[0]
        assert row["class_name"] == CLASSES[int(probs.argmax())] == row["top1_class"]
        assert float(row["probability"]) == pytest.approx(float(probs.max()), abs=1e-5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data.root=/no/such/folder"], r"error: Data folder '/no/such/folder' does not exist"),
        (["--model.backbone=resnet_18"], r"error: Unknown backbone 'resnet_18'.*did you mean resnet18"),
        (["--model.dropout=0.5"], r"error: .*dropout"),
        (["--ckpt_path=last"], r"error: --ckpt_path last: there is no run to resume"),
        (["--data.num_classes=3"], r"error: --data.num_classes=3, but .* has 6 class folders"),
    ],
)
def test_user_errors_are_one_message(
    workdir: Path, shapes_root: Path, capsys, args: list[str], message: str
) -> None:
    assert run_cli("fit", *fast_args(shapes_root), *args) == 2
    err = capsys.readouterr().err
    assert re.search(message, err, re.DOTALL), err
    assert "Traceback" not in err


def test_unknown_key_in_a_config_file(workdir: Path, shapes_root: Path, capsys) -> None:
    (workdir / "mine.yaml").write_text("data:\n  batch_sise: 8\n")
    assert run_cli("fit", *fast_args(shapes_root), "--config=mine.yaml") == 2
    assert re.search(r"error: .*batch_sise", capsys.readouterr().err)


@pytest.mark.parametrize("subcommand", ["fit", "validate", "test", "predict", "export"])
def test_missing_checkpoint_file(workdir: Path, capsys, subcommand: str) -> None:
    assert run_cli(subcommand, "--ckpt_path=nowhere/model.ckpt") == 2
    assert "error: Checkpoint 'nowhere/model.ckpt' (--ckpt_path) does not exist." in capsys.readouterr().err


def test_predict_without_checkpoint(workdir: Path, capsys) -> None:
    assert run_cli("predict", "--data.predict_dir=.") == 2
    assert "`predict` needs a trained model. Fix: pass --ckpt_path" in capsys.readouterr().err


def test_bad_image_in_a_worker_is_one_message(
    workdir: Path, shapes_root: Path, tmp_path: Path, capsys
) -> None:
    import shutil

    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    write_image(root / "train" / "star" / "x.png").write_bytes(b"\x89PNG broken")
    assert run_cli("fit", *fast_args(root, "--data.num_workers=1")) == 2
    err = capsys.readouterr().err
    assert re.search(r"(?m)^error: Cannot decode image '.*x.png'.*skip_bad_images", err), err
    assert "Traceback" not in err


def test_print_config_shows_optimizer_and_schedule(workdir: Path, capsys) -> None:
    assert run_cli("fit", "--print_config") == 0
    out = capsys.readouterr().out
    for expected in (
        "class_path: torch.optim.AdamW",
        "project.schedulers.WarmupCosineLR",
        "label_smoothing",
        "precision",
        "gradient_clip_val",
        "accumulate_grad_batches",
        "seed_everything: 42",
    ):
        assert expected in out


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_checkpoint_loads_on_cpu(workdir: Path, shapes_root: Path) -> None:
    assert run_cli("fit", *fast_args(shapes_root, "--name=g", "--trainer.accelerator=gpu")) == 0
    checkpoint = torch.load(
        workdir / "checkpoints" / "g" / "last.ckpt", map_location="cpu", weights_only=False
    )
    model = ImageClassifier(num_classes=6, backbone="resnet18", scheduler=None)
    model.load_state_dict(checkpoint["state_dict"])
    args = [f"--ckpt_path={workdir / 'checkpoints' / 'g' / 'last.ckpt'}", f"--data.root={shapes_root}"]
    assert run_cli("validate", *args, "--trainer.accelerator=cpu", "--data.num_workers=0") == 0


@pytest.mark.parametrize(
    "form", ["--config configs/presets/debug.yaml", "--config=configs/presets/debug.yaml"]
)
def test_the_docs_preset_paths_work_from_any_folder(workdir: Path, capsys, form: str) -> None:
    """An installed copy (or a run from another folder) has no configs/ here: the package's are used."""
    assert not (workdir / "configs").exists()
    assert run_cli("fit", *form.split(" "), "--print_config") == 0
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["fast_dev_run"] == 5  # debug.yaml's value
    (workdir / "configs" / "presets").mkdir(parents=True)
    (workdir / "configs" / "presets" / "debug.yaml").write_text("trainer:\n  fast_dev_run: 2\n")
    assert run_cli("fit", *form.split(" "), "--print_config") == 0  # a file of that path here wins
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["fast_dev_run"] == 2


def test_no_command_lists_every_command(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Before: LightningCLI's usage, which names only its own subcommands (infer, serve, report, new and
    the others appeared only under --help)."""
    from project import __main__

    monkeypatch.setattr(sys, "argv", ["project"])
    with pytest.raises(SystemExit) as exit:
        __main__.main()
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: No command given; the commands are fit, ") and err.count("\n") == 1
    listed = err.split("the commands are ")[1].split(".")[0].split(", ")
    assert sorted(listed) == sorted([*ProjectCLI.subcommands(), *__main__.COMMANDS])


def test_help_names_every_command_of_its_own_module(capsys) -> None:
    """The --help description is made from the dispatch table (a hand-kept list had no `optimize`)."""
    from project import __main__

    with pytest.raises(SystemExit):
        ProjectCLI(args=["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name, (_, what, _) in __main__.COMMANDS.items():
        assert f"{name} ({' '.join(what.split())})" in text
