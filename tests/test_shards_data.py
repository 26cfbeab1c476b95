"""What a shard sample holds and how a bad one is reported or skipped (data/streaming.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from project.data.datamodule import ImageDataModule
from project.data.decode import BadImageError
from project.errors import UserError
from project.optimize import main as optimize
from tests.helpers import exit_status

pytest.importorskip("litdata")

from project.data.streaming import ShardDataset


@pytest.fixture(scope="module")
def with_a_bad_file(shapes_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shapes' val split as shards, with one file that is not an image (stored as it is)."""
    root = tmp_path_factory.mktemp("bad") / "images"
    shutil.copytree(shapes_root, root)
    (root / "val" / "star" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a JPEG")
    out = root.parent / "shards"
    assert exit_status(optimize, f"--data.root={root}", f"--output={out}", "--workers=1") == 0
    return out / "val"


def samples(url: Path, **options: object) -> list:
    data = ShardDataset(str(url), lambda image: image, shuffle=False, **options)
    return [data[i] for i in range(len(data))]


def test_a_bad_sample_names_the_file_it_came_from(with_a_bad_file: Path) -> None:
    with pytest.raises(BadImageError, match=r"sample \d+ \(star/broken.jpg\)"):
        samples(with_a_bad_file)


def test_skip_bad_images_leaves_the_bad_sample_out(with_a_bad_file: Path) -> None:
    with pytest.warns(UserWarning, match="Skipped a bad image"):
        found = samples(with_a_bad_file, skip_bad_images=True)
    assert len(found) == 25 and sum(sample is None for sample in found) == 1
    assert all(sample[0].shape[0] == 3 for sample in found if sample is not None)


def test_balance_loss_weighs_classes_by_the_counts_in_the_index(with_a_bad_file: Path) -> None:
    images = with_a_bad_file.parent.parent / "images"
    shards = ImageDataModule(root=str(with_a_bad_file.parent), balance="loss")
    assert shards.class_names == ImageDataModule(root=str(images)).class_names
    assert shards.class_weights == ImageDataModule(root=str(images), balance="loss").class_weights


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"cache": True}, "--data.cache=true: shards are streamed"),
        ({"balance": "sampler"}, "balance=sampler"),
    ],
)
def test_options_that_need_the_whole_split_are_refused(
    with_a_bad_file: Path, option: dict, message: str
) -> None:
    with pytest.raises(UserError, match=message):
        ImageDataModule(root=str(with_a_bad_file.parent), **option)
