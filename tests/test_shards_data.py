"""What a shard sample holds, how a bad one is reported or skipped when read (data/streaming.py), and how
`optimize` checks every image it stores (optimize.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from project.data.datamodule import ImageDataModule
from project.data.decode import BadImageError
from project.errors import UserError
from project.optimize import main as optimize
from tests.helpers import exit_status
from tests.shard_files import samples, write_shards, write_split

pytest.importorskip("litdata")

from project.data.streaming import ShardSource

NOT_A_JPEG = b"\xff\xd8\xff not a JPEG"


@pytest.fixture
def with_a_bad_sample(tmp_path: Path) -> Path:
    """Shards whose val split holds one sample that is not an image (as damage in storage would leave)."""
    root = write_shards(tmp_path / "shards", {"train": 12, "val": 6})
    items = samples(6, 3)
    items[4] = {**items[4], "image": NOT_A_JPEG, "path": "c1/broken.jpg"}
    for name in ("chunk-0-0.bin", "index.json"):
        (root / "val" / name).unlink()
    write_split(root / "val", items)
    return root


def read(root: Path, skip_bad_images: bool = False) -> list:
    data = ShardSource(str(root)).dataset("val", lambda image: image, False, 0, skip_bad_images)
    return [data[i] for i in range(len(data))]


def test_a_bad_sample_names_the_file_it_came_from(with_a_bad_sample: Path) -> None:
    with pytest.raises(BadImageError, match=r"sample 4 \(c1/broken.jpg\)"):
        read(with_a_bad_sample)


def test_skip_bad_images_leaves_the_bad_sample_out(with_a_bad_sample: Path) -> None:
    with pytest.warns(UserWarning, match="Skipped a bad image"):
        found = read(with_a_bad_sample, skip_bad_images=True)
    assert len(found) == 6 and sum(sample is None for sample in found) == 1
    assert all(sample[0].shape[0] == 3 for sample in found if sample is not None)


@pytest.fixture(scope="module")
def shapes_shards(shapes_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards") / "shapes"
    assert exit_status(optimize, f"--data.root={shapes_root}", f"--output={out}", "--workers=1") == 0
    return out


# room: recipes begin
def test_balance_loss_weighs_classes_by_the_counts_in_the_index(
    shapes_shards: Path, shapes_root: Path
) -> None:
    shards = ImageDataModule(root=str(shapes_shards), balance="loss")
    assert shards.class_names == ImageDataModule(root=str(shapes_root)).class_names
    assert shards.class_weights == ImageDataModule(root=str(shapes_root), balance="loss").class_weights


# room: recipes end
@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"cache": True}, "--data.cache=true: shards are streamed"),  # room: cache
        ({"balance": "sampler"}, "balance=sampler"),  # room: recipes
    ],
)
def test_options_that_need_the_whole_split_are_refused(
    shapes_shards: Path, option: dict, message: str
) -> None:
    with pytest.raises(UserError, match=message):
        ImageDataModule(root=str(shapes_shards), **option)


@pytest.fixture
def images_with_a_bad_file(shapes_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "images"
    shutil.copytree(shapes_root, root)
    (root / "val" / "star" / "broken.jpg").write_bytes(NOT_A_JPEG)
    return root


def test_optimize_stops_on_a_bad_image_naming_it_and_writes_no_index(
    images_with_a_bad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    status = exit_status(optimize, f"--data.root={images_with_a_bad_file}", f"--output={out}", "--workers=1")
    captured = capsys.readouterr()
    assert status != 0
    assert "broken.jpg" in captured.out + captured.err
    assert not (out / "shards.json").exists()


def test_optimize_with_skip_bad_images_leaves_the_file_out_and_lists_it(
    images_with_a_bad_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = [f"--data.root={images_with_a_bad_file}", f"--output={out}", "--workers=1"]
    assert exit_status(optimize, *args, "--data.skip_bad_images=true") == 0
    record = json.loads((out / "shards.json").read_text())
    assert record["splits"]["val"]["count"] == 24 and record["splits"]["val"]["skipped"] == 1
    assert record["splits"]["val"]["class_counts"]["star"] == 4
    listed = (out / "skipped_files.txt").read_text()
    assert listed.startswith("val/star/broken.jpg\t")
    source = ShardSource(str(out))
    data = source.dataset("val", lambda image: image, False, 0, skip_bad_images=False)
    assert sorted(data[i][0].shape[0] for i in range(len(data))) == [3] * 24  # every stored sample decodes
