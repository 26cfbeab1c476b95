"""Invalid option values end in one clear error before anything is trained (property-based)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonargparse import Namespace

from project.config_checks import check_batch_fits, check_cli_config
from project.data import datamodule as datamodule_module
from project.data.datamodule import ImageDataModule, usable_cores
from project.errors import UserError
from project.model import ImageClassifier
from tests.helpers import fast_args, run_cli

EXAMPLES = settings(max_examples=40, deadline=None)
non_positive_ints = st.integers(max_value=0)
numbers = st.floats(allow_nan=True, allow_infinity=True)


@EXAMPLES
@given(non_positive_ints)
def test_batch_size_must_be_positive(value: int) -> None:
    with pytest.raises(
        UserError, match=rf"--data.batch_size={value} is out of range: it must be an integer >= 1"
    ):
        ImageDataModule(batch_size=value)


@EXAMPLES
@given(non_positive_ints)
def test_image_size_must_be_positive(value: int) -> None:
    with pytest.raises(UserError, match=rf"--data.image_size={value} is out of range"):
        ImageDataModule(image_size=value)


@EXAMPLES
@given(numbers.filter(lambda v: not 0 < v < 1))
def test_val_split_must_be_inside_0_1(value: float) -> None:
    with pytest.raises(
        UserError, match=r"--data.val_split=.* is out of range: it must be a number between 0 and 1"
    ):
        ImageDataModule(val_split=value)


@EXAMPLES
@given(numbers.filter(lambda v: not v > 0))
def test_learning_rate_must_be_positive(value: float) -> None:
    config = Namespace(
        model=Namespace(optimizer=Namespace(init_args=Namespace(lr=value))), trainer=Namespace()
    )
    with pytest.raises(
        UserError, match=r"--model.optimizer.init_args.lr=.* is out of range: it must be a number > 0"
    ):
        check_cli_config(config)


@EXAMPLES
@given(non_positive_ints)
def test_accumulate_grad_batches_must_be_positive(value: int) -> None:
    config = Namespace(trainer=Namespace(accumulate_grad_batches=value))
    with pytest.raises(UserError, match=rf"--trainer.accumulate_grad_batches={value} is out of range"):
        check_cli_config(config)


@EXAMPLES
@given(st.text(min_size=1, max_size=20).filter(lambda s: s.strip() and s not in ("resnet18",)))
def test_unknown_backbone_is_named(name: str) -> None:
    from project.torchvision_backbones import classification_models

    if name in classification_models():
        return
    with pytest.raises(UserError, match=r"(?s)Unknown backbone '.*' \(--model.backbone\)"):
        ImageClassifier(num_classes=3, backbone=name)


def test_valid_values_pass() -> None:
    ImageDataModule(batch_size=1, image_size=1, val_split=0.5)
    check_cli_config(
        Namespace(model=Namespace(optimizer=Namespace(init_args=Namespace(lr=1e-9))), trainer=Namespace())
    )


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--data.batch_size=0", "--data.batch_size=0 is out of range: it must be an integer >= 1"),
        ("--data.batch_size=-4", "--data.batch_size=-4 is out of range"),
        ("--model.optimizer.init_args.lr=0", "--model.optimizer.init_args.lr=0.0 is out of range"),
        ("--model.optimizer.init_args.lr=-0.1", "--model.optimizer.init_args.lr=-0.1 is out of range"),
        ("--data.image_size=0", "--data.image_size=0 is out of range"),
        ("--model.backbone=resnet181", "Unknown backbone 'resnet181' (--model.backbone)"),
        ("--data.val_split=1.5", "--data.val_split=1.5 is out of range"),
        ("--data.val_split=0", "--data.val_split=0.0 is out of range"),
        ("--trainer.accumulate_grad_batches=0", "--trainer.accumulate_grad_batches=0 is out of range"),
        ("--trainer.precision=17-mixed", "--trainer.precision=17-mixed is not one of 'transformer-engine'"),
    ],
)
def test_cli_stops_before_training(workdir: Path, shapes_root: Path, flag: str, message: str, capsys) -> None:
    assert run_cli("fit", *fast_args(shapes_root, "--name=bad", flag)) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert not (workdir / "checkpoints" / "bad").exists()  # nothing was trained or written
    assert not list((workdir / "logs").glob("bad/*.tfevents*"))


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (
            "--model.optimizer.init_args.weight_decay=-1",
            "--model.optimizer.init_args.weight_decay=-1.0 is out of range: it must be a number >= 0",
        ),
        (
            "--model.scheduler.init_args.warmup_steps=-5",
            "--model.scheduler.init_args.warmup_steps=-5 is out of range: it must be an integer >= 0",
        ),
        (
            "--model.scheduler.init_args.max_warmup_fraction=-0.5",
            "--model.scheduler.init_args.max_warmup_fraction=-0.5 is out of range: it must be a number >= 0",
        ),
        ("--trainer.gradient_clip_val=-1", "--trainer.gradient_clip_val=-1.0 is out of range: it must be a"),
        ("--predictions.top_k=-3", "--predictions.top_k=-3 is out of range: it must be an integer >= 1"),
        ("--data.image_size=100000", "--data.image_size=100000 is too large: a batch of 16 images"),
        (  # 12 training images of 32 px: the batch size is the typo, not the image size
            "--data.batch_size=1000000000",
            "--data.batch_size=1,000,000,000 is too large: a batch of 1,000,000,000 images of 32x32 px",
        ),
        (
            "--data.num_workers=1000",
            f"--data.num_workers=1000 is out of range: it must be an integer from 0 to {4 * usable_cores()} "
            f"(4 per CPU core: this process may use {usable_cores()}; null: one per core, at most 8)",
        ),
        ("--model.backbone=inception_v3", "Backbone 'inception_v3' cannot take 32 px images"),
    ],
)
def test_more_bad_values_end_in_one_line(
    workdir: Path, shapes_root: Path, flag: str, message: str, capsys
) -> None:
    assert run_cli("fit", *fast_args(shapes_root, "--name=bad", flag)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last and "Fix: " in last
    assert not (workdir / "checkpoints" / "bad").exists()


def test_a_single_class_ends_in_one_line(workdir: Path, shapes_root: Path, capsys) -> None:
    single = workdir / "single"
    shutil.copytree(shapes_root / "train" / "circle", single / "circle")
    assert run_cli("fit", *fast_args(single, "--name=bad", "--data.val_split=0.25")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            f"error: '{single}' has 1 class folder ['circle']: a classifier needs at least 2 classes. Fix: "
        )
    )


def test_batch_that_outgrows_memory_is_refused_with_sizes() -> None:
    check_batch_fits(224, 64, memory=2**30)  # 37 MiB of input: fine
    with pytest.raises(
        UserError, match=r"takes 1\.1 GiB as the network's input alone, more than .* 1\.0 GiB"
    ):
        check_batch_fits(1000, 100, memory=2**30)


def test_the_batch_size_is_named_when_the_image_size_would_fit() -> None:
    with pytest.raises(UserError) as caught:
        check_batch_fits(1000, 100, memory=2**30)  # 11.4 MiB per image: 89 fit
    assert str(caught.value).startswith("--data.batch_size=100 is too large: a batch of 100 images of 1000x")
    assert "Fix: set --data.batch_size to at most 89 at this image size" in str(caught.value)
    with pytest.raises(UserError, match=r"^--data.image_size=10000 is too large: a batch of 8 images"):
        check_batch_fits(10_000, 8, memory=2**30)  # 1.1 GiB per image: not one fits


def test_num_workers_is_bounded_by_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datamodule_module, "usable_cores", lambda: 2)
    ImageDataModule(num_workers=8)
    with pytest.raises(UserError) as caught:
        ImageDataModule(num_workers=9)
    assert str(caught.value) == (
        "--data.num_workers=9 is out of range: it must be an integer from 0 to 8 (4 per CPU core: this "
        "process may use 2; null: one per core, at most 8). Fix: set --data.num_workers to an integer "
        "from 0 to 8 (4 per CPU core: this process may use 2; null: one per core, at most 8)."
    )


@EXAMPLES
@given(st.integers(max_value=-1))
def test_warmup_steps_must_not_be_negative(value: int) -> None:
    config = Namespace(model=Namespace(scheduler=Namespace(init_args=Namespace(warmup_steps=value))))
    with pytest.raises(UserError, match=rf"--model.scheduler.init_args.warmup_steps={value} is out of range"):
        check_cli_config(config)


@EXAMPLES
@given(numbers.filter(lambda v: not v >= 0))
def test_gradient_clip_val_must_not_be_negative(value: float) -> None:
    with pytest.raises(UserError, match=r"--trainer.gradient_clip_val=.* is out of range"):
        check_cli_config(Namespace(trainer=Namespace(gradient_clip_val=value)))
