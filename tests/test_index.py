from pathlib import Path

import numpy as np
import pytest

from project.data.folders import scan_folder
from project.data.index import list_images, stratified_split
from project.errors import UserError
from tests.helpers import write_image


def test_scan_folder_finds_classes_and_extensions_in_any_case(tmp_path: Path) -> None:
    for name in ("a/1.JPG", "a/2.jpeg", "a/sub/3.Png", "b/4.webp", "b/5.tif", "b/.hidden.jpg", "b/notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / ".DS_Store").mkdir()
    index = scan_folder(tmp_path)
    assert index.class_names == ("a", "b")
    assert [p.decode() for p in index.paths] == ["a/1.JPG", "a/2.jpeg", "a/sub/3.Png", "b/4.webp", "b/5.tif"]
    assert index.labels.tolist() == [0, 0, 0, 1, 1]
    assert index.paths.dtype.kind == "S" and index.labels.dtype == np.int64


def test_missing_root_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"'.*nowhere' does not exist.*Fix: set --data.root"):
        scan_folder(tmp_path / "nowhere")


def test_no_class_folders(tmp_path: Path) -> None:
    write_image(tmp_path / "loose.png")
    with pytest.raises(UserError, match="has no class sub-folders"):
        scan_folder(tmp_path)


def test_class_folder_without_images_is_named(tmp_path: Path) -> None:
    write_image(tmp_path / "cat" / "1.png")
    (tmp_path / "dog").mkdir()
    (tmp_path / "dog" / "readme.txt").write_text("no images here")
    with pytest.raises(UserError, match=r"Class folder '.*dog' has no images"):
        scan_folder(tmp_path)


def test_other_split_must_have_the_same_classes(tmp_path: Path) -> None:
    write_image(tmp_path / "cat" / "1.png")
    write_image(tmp_path / "cow" / "1.png")
    with pytest.raises(UserError, match=r"missing \['dog'\], unexpected \['cow'\]"):
        scan_folder(tmp_path, ["cat", "dog"])


def test_stratified_split_is_stable_and_per_class() -> None:
    labels = np.repeat(np.arange(3), [10, 20, 50])
    train, val = stratified_split(labels, 0.1, seed=0)
    again_train, again_val = stratified_split(labels, 0.1, seed=0)
    assert np.array_equal(val, again_val) and np.array_equal(train, again_train)
    assert np.bincount(labels[val]).tolist() == [1, 2, 5]
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(80))
    assert not np.array_equal(stratified_split(labels, 0.1, seed=1)[1], val)


def test_split_fraction_outside_range() -> None:
    with pytest.raises(UserError, match=r"val_split=1.5 is outside \(0, 1\)"):
        stratified_split(np.zeros(4, dtype=np.int64), 1.5, 0)


def test_list_images_skips_hidden_folders(tmp_path: Path) -> None:
    write_image(tmp_path / ".cache" / "x.png")
    write_image(tmp_path / "y.png")
    assert list_images(tmp_path) == ["y.png"]


def test_folder_links_into_the_data_are_skipped_with_a_warning(tmp_path: Path) -> None:
    for name in ("circle/1.png", "circle/2.png", "square/1.png", "outside/extra/1.png"):
        write_image(tmp_path / name)
    root = tmp_path / "train"
    root.mkdir()
    (root / "circle").symlink_to(tmp_path / "circle")  # a class folder may itself be a link
    (root / "square").symlink_to(tmp_path / "square")
    (root / "circle" / "loop").symlink_to("..")  # around the data folder: a loop
    (root / "circle" / "again").symlink_to(tmp_path / "circle")  # its own class again
    (root / "circle" / "squares").symlink_to(tmp_path / "square")  # another class
    (root / "square" / "extra").symlink_to(tmp_path / "outside" / "extra")  # new images outside: kept
    (root / "square" / "extra2").symlink_to(tmp_path / "outside")  # around what was just followed
    with pytest.warns(UserWarning) as caught:
        index = scan_folder(root)
    expected = ["circle/1.png", "circle/2.png", "square/1.png", "square/extra/1.png"]
    assert [p.decode() for p in index.paths] == expected
    assert index.labels.tolist() == [0, 0, 1, 1]
    skipped = sorted(str(w.message).split("'")[1].rsplit("/", 1)[1] for w in caught)
    assert skipped == ["again", "extra2", "loop", "squares"]
    assert all("already indexed" in str(w.message) for w in caught)


def test_list_images_does_not_loop_through_a_link_to_itself(tmp_path: Path) -> None:
    write_image(tmp_path / "a" / "1.png")
    (tmp_path / "a" / "self").symlink_to(tmp_path / "a")
    with pytest.warns(UserWarning, match=r"Skipped the folder link '.*a/self'"):
        assert list_images(tmp_path) == ["a/1.png"]
