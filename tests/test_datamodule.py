from pathlib import Path

import pytest
import torch

from project.data.datamodule import ImageDataModule
from project.data.shapes import CLASSES
from project.errors import UserError
from tests.helpers import write_image


def test_train_val_layout(shapes_root: Path) -> None:
    dm = ImageDataModule(root=str(shapes_root), image_size=24, batch_size=5, num_workers=0)
    assert dm.class_names == list(CLASSES)
    assert dm.num_classes == 6
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8 and tuple(images.shape) == (5, 3, 24, 24)
    assert labels.dtype == torch.int64 and labels.max() < 6
    assert len(dm.datasets["val"]) == 24


def test_val_split_is_stratified_and_the_same_every_time(flat_root: Path) -> None:
    def val_files(seed_everything: int) -> list[bytes]:
        torch.manual_seed(seed_everything)  # the training seed must not move the split
        dm = ImageDataModule(root=str(flat_root), val_split=0.25, num_workers=0)
        return dm.splits["val"].paths.tolist()

    first = val_files(0)
    assert first == val_files(1)
    dm = ImageDataModule(root=str(flat_root), val_split=0.25, num_workers=0)
    assert list(dm.splits["val"].class_counts().values()) == [2] * 6
    assert len(dm.splits["train"]) == 36


def test_flat_folder_without_val_split_says_how(flat_root: Path) -> None:
    with pytest.raises(UserError, match=r"no train/ and val/ folders.*--data.val_split=0.1"):
        _ = ImageDataModule(root=str(flat_root)).num_classes


def test_num_classes_that_disagrees(shapes_root: Path) -> None:
    with pytest.raises(UserError, match=r"--data.num_classes=10, but '.*' has 6 class folders"):
        _ = ImageDataModule(root=str(shapes_root), num_classes=10).num_classes


def test_val_classes_differ_from_train(tmp_path: Path) -> None:
    write_image(tmp_path / "train" / "cat" / "1.png")
    write_image(tmp_path / "train" / "dog" / "1.png")
    write_image(tmp_path / "val" / "cat" / "1.png")
    with pytest.raises(UserError, match=r"val' differ from the training classes: missing \['dog'\]"):
        _ = ImageDataModule(root=str(tmp_path)).num_classes


def test_optional_test_split(shapes_root: Path, tmp_path: Path) -> None:
    dm = ImageDataModule(root=str(shapes_root), num_workers=0)
    with pytest.warns(UserWarning, match="no test/ folder"):
        dm.setup("test")
    assert len(dm.datasets["test"]) == len(dm.splits["val"])


def test_bad_image_stops_or_is_skipped(shapes_root: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    (root / "val" / "ring" / "zz-broken.jpg").write_bytes(b"\xff\xd8\xff not really")
    strict = ImageDataModule(root=str(root), num_workers=0, batch_size=100)
    strict.setup("validate")
    with pytest.raises(UserError, match=r"Cannot decode image '.*zz-broken.jpg'"):
        next(iter(strict.val_dataloader()))
    lenient = ImageDataModule(root=str(root), num_workers=0, batch_size=100, skip_bad_images=True)
    lenient.setup("validate")
    with pytest.warns(UserWarning, match=r"Skipped a bad image \(1 in this worker so far\).*zz-broken.jpg"):
        images, _ = next(iter(lenient.val_dataloader()))
    assert len(images) == 24


def test_embedded_data_is_generated_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import project.data.datamodule as datamodule
    from project.data import shapes

    made = []
    monkeypatch.setattr(datamodule, "EMBEDDED_ROOT", tmp_path / "data" / "shapes")
    monkeypatch.setattr(
        datamodule,
        "generate_shapes",
        lambda root: made.append(root) or shapes.generate_shapes(root, 2, 1, 16),
    )
    dm = datamodule.ImageDataModule(root=None)
    assert dm.num_classes == 6 and made == [tmp_path / "data" / "shapes"]
    assert len(list((tmp_path / "data" / "shapes" / "train").rglob("*.jpg"))) == 12
    root = tmp_path / "data" / "shapes"
    assert capsys.readouterr().out == (
        "Generating the embedded shapes data set (6 classes, 4,800 train and 600 val images) "
        f"in {root}/ (once; later runs reuse it).\n"
    )
    datamodule.ImageDataModule(root=None)  # reused: nothing said
    assert capsys.readouterr().out == ""
