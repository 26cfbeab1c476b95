"""The data check: class counts and the first batch are shown, and bad labels or inputs stop the run."""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from project.callbacks import DataCheck
from project.callbacks.data_check import check_labels, class_count_table
from project.data.index import ImageIndex
from project.errors import UserError
from project.model import ImageClassifier
from tests.helpers import TensorData, fast_args, run_cli, tiny_trainer


def fit(images: torch.Tensor, labels: torch.Tensor, num_classes: int = 10) -> None:
    model = ImageClassifier(num_classes=num_classes, backbone="resnet18", scheduler=None)
    tiny_trainer(DataCheck(), limit_train_batches=2, limit_val_batches=0).fit(
        model, TensorData(images, labels)
    )


@pytest.mark.slow
def test_label_out_of_range_stops_before_the_first_step() -> None:
    labels = torch.arange(16) % 10
    labels[3] = 100
    images = torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8)
    with pytest.raises(UserError, match=r"1 label\(s\) outside \[0, 10\).*\[100\].*0\.\.9"):
        fit(images, labels)


def test_index_labels_are_checked_against_the_model() -> None:
    with pytest.raises(UserError, match=r"The train split has 2 label\(s\) outside \[0, 6\).*\[-1, 6\]"):
        check_labels(np.array([0, 5, 6, -1]), 6, "The train split")


@pytest.mark.slow
def test_nan_image_stops_with_the_count() -> None:
    images = torch.rand(16, 3, 16, 16) * 255
    images[2, 1, 4, 4] = float("nan")
    with pytest.raises(UserError, match=r"1 NaN and 0 infinite input values"):
        fit(images, torch.arange(16) % 10)


@pytest.mark.slow
def test_constant_batch_stops() -> None:
    images = torch.zeros(16, 3, 16, 16, dtype=torch.uint8)
    with pytest.raises(UserError, match=r"Every value of the first training batch is 0"):
        fit(images, torch.arange(16) % 10)


@pytest.mark.slow
def test_tables_are_printed_logged_and_imbalance_warned(
    workdir: Path, shapes_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = workdir / "imbalanced"
    shutil.copytree(shapes_root, root)
    for extra in sorted((root / "train" / "star").iterdir())[1:]:
        extra.unlink()  # star: 1 training image, the others 8
    caplog.set_level(logging.INFO)
    with pytest.warns(
        UserWarning, match=r"train split is imbalanced: 'circle' has 8 images, 'star' 1 \(8x\)"
    ):
        assert run_cli("fit", *fast_args(root, "--name=d", "--data_check.imbalance_ratio=4")) == 0
    text = caplog.text
    assert "  star            1        4\n" in text  # class, train, val
    assert "  total          41       24\n" in text
    assert "images [16, 3, 32, 32] torch.uint8" in text
    assert "values 0..5 (num_classes 6)" in text
    events = EventAccumulator(str(workdir / "logs" / "d"))
    events.Reload()
    assert {"data_check/class_counts/text_summary", "data_check/first_batch/text_summary"} <= set(
        events.Tags()["tensors"]
    )


@pytest.mark.slow
def test_the_check_can_be_turned_off(
    workdir: Path, shapes_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    assert run_cli("fit", *fast_args(shapes_root, "--data_check.enabled=false")) == 0
    assert "Data check" not in caplog.text


@pytest.mark.slow
def test_labels_of_shape_n_by_1_are_named_by_their_shape() -> None:
    images = torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8)
    labels = (torch.arange(16) % 4)[:, None]
    with pytest.raises(
        UserError, match=r"has labels of shape \[N, 1\]; class indices of shape \[N\] expected"
    ) as e:
        fit(images, labels, num_classes=4)
    assert "outside" not in str(e.value) and "squeeze(1)" in str(e.value)


def test_one_hot_integer_labels_are_named_one_hot() -> None:
    one_hot = torch.nn.functional.one_hot(torch.arange(8) % 4, 4)
    with pytest.raises(UserError, match=r"shape \[N, 4\] that look one-hot.*Fix: turn them into .*argmax"):
        check_labels(one_hot, 4, "The first training batch")
    # room: multilabel begin
    with pytest.raises(UserError, match=r"make the task multilabel"):
        check_labels(one_hot, 4, "The first training batch")
    # room: multilabel end
    with pytest.raises(UserError, match=r"shape \[N, 3\]; class indices of shape \[N\] expected"):
        check_labels(torch.zeros(8, 3, dtype=torch.long), 4, "The first training batch")


# room: multilabel begin
def test_multi_label_targets_are_checked_as_multi_hot_rows() -> None:
    multi_hot = torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.uint8)
    for targets in (multi_hot, multi_hot.float(), multi_hot.numpy()):
        check_labels(targets, 4, "The train split", multilabel=True)  # passes
    with pytest.raises(
        UserError, match=r"shape \[2, 3\]; a multi-label model with 4 classes expects .*\[N, 4\]"
    ):
        check_labels(multi_hot[:, :3], 4, "The train split", multilabel=True)
    with pytest.raises(UserError, match=r"1 multi-label target\(s\) outside \[0, 1\]: \[2\]"):
        check_labels(multi_hot + torch.eye(2, 4, dtype=torch.uint8), 4, "The train split", multilabel=True)


# room: multilabel end


# configs/default.yaml's settings as shipped, given here so that a clone that edits default.yaml still passes
SHAPES = ["--data.image_size=64", "--data.scale=[0.7,1.0]", "--trainer.max_epochs=4"]


def photo_folder(root: Path, size: tuple[int, int]) -> Path:
    """2 classes x 4 noise images of `size` in train/ and val/."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            for i in range(4):
                pixels = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    ("size", "flags", "hint"),
    [
        ((200, 150), SHAPES, True),  # photos, the shapes defaults: pointed to the photo settings
        ((200, 150), [*SHAPES[:2], "--trainer.max_epochs=1"], True),  # one epoch: the same 64 px inputs
        ((200, 150), ["--data.image_size=48", "--data.scale=[0.3,1.0]"], True),  # smaller still
        ((200, 150), ["--config=configs/experiments/photos.yaml", "--trainer.max_epochs=2"], False),
        ((100, 100), SHAPES, False),  # small images: the defaults fit them
    ],
    ids=["photos-defaults", "photos-one-epoch", "photos-48px", "photos-settings", "small-defaults"],
)
def test_photos_trained_with_the_shapes_defaults_are_pointed_to_the_photo_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: tuple[int, int], flags: list[str], hint: bool
) -> None:
    root = photo_folder(tmp_path / "photos", size)
    monkeypatch.chdir(tmp_path)  # configs/... resolves to the package's own
    args = [
        f"--data.root={root}",
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--model.backbone=resnet18",
        "--trainer.limit_train_batches=1",
        "--trainer.limit_val_batches=0",
        "--trainer.enable_progress_bar=false",
        "--export_best.enabled=false",
        *flags,
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_cli("fit", *args) == 0
    found = [str(w.message) for w in caught if "look like photos" in str(w.message)]
    if hint:
        inputs = 48 if "--data.image_size=48" in flags else 64
        assert found == [
            f"The training images look like photos (median {size[0]}x{size[1]} px, 8 sampled), but this run "
            f"feeds the model {inputs} px inputs, the size tuned for the embedded 64 px shapes: most of a "
            "photo's detail is lost. Fix: start from pretrained weights (--model.weights=DEFAULT, or a "
            "local file: the run then takes their input size), or --config configs/experiments/photos.yaml "
            "(128 px, stronger crops, 16 epochs), or set --data.image_size yourself (measured on photos: "
            'docs/training.md, "Photos").'
        ]
    else:
        assert found == []


def test_a_validation_split_too_small_to_rank_checkpoints_is_warned_about() -> None:
    from project.callbacks.data_check import warn_small_validation

    with pytest.warns(
        UserWarning, match=r"only 30 images: val/acc has a standard error of up to 9\.1 points"
    ):
        warn_small_validation(30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_small_validation(600)  # the embedded shapes' 600: no warning
        warn_small_validation(30, multilabel=True)  # room: multilabel


def test_the_class_count_table_of_many_classes_has_a_bounded_number_of_lines() -> None:
    classes = 2000
    labels = np.repeat(np.arange(classes), np.arange(classes) % 7 + 1)
    names = tuple(f"class-{i}" for i in range(classes))
    index = ImageIndex(Path("."), np.zeros(len(labels), dtype="S1"), labels, names)
    val = index.subset(np.arange(0, len(labels), 2))
    table = class_count_table({"train": index.class_counts(), "val": val.class_counts()})
    lines = table.splitlines()
    assert len(lines) == 24  # title, header, 10 largest, "...", 10 smallest, total
    assert "2000 classes: the 10 largest and smallest by train images" in lines[0]
    assert lines[2].split()[:2] == ["class-6", "7"] and lines[-2].split()[:2] == ["class-1995", "1"]
    assert lines[12].split() == ["...", "...", "..."]
    assert lines[-1].split() == ["total", str(len(labels)), str((len(labels) + 1) // 2)]
