"""A shards folder or bucket is data, never code: crafted or damaged shards are one error line, run
nothing, import nothing and write nothing outside the cache (data/shard_checks.py, data/shards.py,
data/streaming.py)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from project.errors import UserError
from tests.helpers import run_cli
from tests.shard_files import edit_json, samples, write_shards, write_split

litdata = pytest.importorskip("litdata")

from litdata.streaming.serializers import _SERIALIZERS  # noqa: E402

from project.data.streaming import ShardSource  # noqa: E402


def read_all(root: Path, split: str = "train") -> list:
    """Every sample of a split, as fit's data set reads them (the split checked first)."""
    data = ShardSource(str(root)).dataset(split, lambda image: image, False, 0, skip_bad_images=False)
    return [data[i] for i in range(len(data))]


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    return write_shards(tmp_path / "shards")


class Payload:
    """Unpickling it creates `marker`: the proof that a pickled field ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable, tuple]:
        return (Path.write_text, (self.marker, "ran"))


def test_a_pickled_label_field_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    root = write_shards(tmp_path / "shards")
    marker = tmp_path / "ran"
    crafted = [{**s, "label": Payload(marker)} for s in samples(12, 3)]
    for name in ("chunk-0-0.bin", "index.json"):
        (root / "train" / name).unlink()
    write_split(root / "train", crafted)  # LitData picks its pickle serializer for the label
    assert json.loads((root / "train" / "index.json").read_text())["config"]["data_format"][1] == "pickle"
    with pytest.raises(UserError, match="field 'label' is stored as 'pickle'; optimize stores it as 'int'"):
        read_all(root)
    assert not marker.exists()


@pytest.mark.parametrize("serializer", sorted(set(_SERIALIZERS) - {"int"}))
def test_every_other_serializer_for_the_label_is_refused(shards: Path, serializer: str) -> None:
    def name_it(index: dict) -> None:
        index["config"]["data_format"][1] = serializer

    edit_json(shards / "train" / "index.json", name_it)
    with pytest.raises(UserError, match=f"field 'label' is stored as '{serializer}'"):
        read_all(shards)


def test_a_pytree_node_naming_a_module_is_refused_and_nothing_is_imported(
    shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "modules" / "shard_marker.py"
    module.parent.mkdir()
    module.write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\ndef touch():\n    return 1\n")
    monkeypatch.syspath_prepend(str(module.parent))

    def defaultdict_node(index: dict) -> None:
        spec = json.loads(index["config"]["data_spec"])
        spec[1]["type"] = "collections.defaultdict"
        keys = ["image", "label", "id", "path"]
        spec[1]["context"] = {
            "default_factory_module": "shard_marker", "default_factory_name": "touch", "dict_context": keys
        }  # fmt: skip
        index["config"]["data_spec"] = json.dumps(spec)

    edit_json(shards / "val" / "index.json", defaultdict_node)
    with pytest.raises(UserError, match=r"'config.data_spec' is .*no other pytree node type is read"):
        read_all(shards, "val")
    assert not (tmp_path / "imported").exists() and "shard_marker" not in sys.modules


@pytest.mark.parametrize(
    "name", ["../../escape.bin", "/tmp/chunk-0-0.bin", "sub/chunk-0-0.bin", "chunk-0-0.bin/.."]
)
def test_chunk_names_that_leave_their_split_are_refused(shards: Path, name: str) -> None:
    edit_json(shards / "train" / "index.json", lambda index: index["chunks"][0].update(filename=name))
    with pytest.raises(UserError, match=r"expected a plain name such as 'chunk-0-0\.bin'"):
        read_all(shards)


def drop(path: str) -> Callable[[dict], None]:
    """Remove data[a][b]... for path 'a.b...'."""

    def change(data: Any) -> None:
        *parents, last = path.split(".")
        for key in parents:
            data = data[key]
        del data[last]

    return change


def put(path: str, value: Any) -> Callable[[dict], None]:
    """Set data[a][b]... = value for path 'a.b...' (list positions as numbers)."""

    def change(data: Any) -> None:
        *parents, last = path.split(".")
        for key in parents:
            data = data[int(key)] if isinstance(data, list) else data[key]
        data[int(last) if isinstance(data, list) else last] = value

    return change


RECORD_DAMAGE = {
    "not JSON": (lambda data: "{not json", "it is not JSON"),
    "a list": (lambda data: [data], "expected a JSON object"),
    "format 1 (class order)": (put("format", 1), "'format' is 1; expected 2"),
    "a bogus task": (put("task", "regression"), "'task' is 'regression'; expected one of multiclass"),
    "class names as a string": (put("class_names", "abcdef"), "'class_names' is 'abcdef'"),
    "duplicate class names": (put("class_names", ["c0", "c0", "c2"]), "distinct names"),
    "a class name not a string": (put("class_names", ["c0", 1, "c2"]), "strings of 1 to 255 characters"),
    "an empty class name": (put("class_names", ["c0", "", "c2"]), "strings of 1 to 255 characters"),
    "no val split": (drop("splits.val"), "an object with train and val"),
    "an unknown split": (put("splits.extra", {"count": 1}), "an object with train and val"),
    "a negative count": (put("splits.train.count", -3), "'splits.train.count' is -3"),
    "an empty split": (put("splits.train.count", 0), "an empty split trains nothing"),
    "a count as text": (put("splits.val.count", "6"), "'splits.val.count' is '6'"),
    "counts that do not add up": (
        put("splits.val.class_counts.c0", 5),
        "counts adding up to the split's count",
    ),
    "a negative class count": (put("splits.val.class_counts.c0", -1), "'splits.val.class_counts'"),
    "a negative skipped count": (put("splits.val.skipped", -1), "'splits.val.skipped' is -1"),
    "a negative max_side": (put("max_side", -1), "'max_side' is -1"),
}


@pytest.mark.parametrize("damage", list(RECORD_DAMAGE))
def test_each_malformed_shards_json_is_one_message(shards: Path, damage: str) -> None:
    change, expected = RECORD_DAMAGE[damage]
    edit_json(shards / "shards.json", change)
    with pytest.raises(UserError, match=r"shards\.json' is not what `optimize` writes") as raised:
        ShardSource(str(shards))
    assert expected in str(raised.value) and "Fix:" in str(raised.value)


INDEX_DAMAGE = {
    "not JSON": (lambda data: "[", "it is not JSON"),
    "no chunks": (drop("chunks"), "expected chunks, config and updated_at"),
    "an MDS shard list": (put("shards", []), "expected chunks, config and updated_at"),
    "no chunk at all": (put("chunks", []), "expected a list of at least one chunk"),
    "a chunk of 0 samples": (put("chunks.0.chunk_size", 0), "holds 0 samples; expected at least 1"),
    "a chunk of -4 samples": (put("chunks.0.chunk_size", -4), "holds -4 samples"),
    "a chunk size as text": (put("chunks.0.chunk_bytes", "12"), "has '12' bytes"),
    "a chunk with dim": (put("chunks.0.dim", 7), "has dim 7; expected null"),
    "a chunk with another key": (put("chunks.0.extra", 1), "expected an object with"),
    "a chunk named twice": (
        lambda data: data["chunks"].append(dict(data["chunks"][0])),
        "names a chunk twice",
    ),
    "compression": (put("config.compression", "zstd"), "'config.compression' is 'zstd'; expected None"),
    "encryption": (put("config.encryption", {"key": "x"}), "'config.encryption'"),
    "another item loader": (
        put("config.item_loader", "TokensLoader"),
        "'config.item_loader' is 'TokensLoader'",
    ),
    "an unknown config key": (put("config.region_of_interest", [[0, 1]]), "'config.region_of_interest'"),
    "fewer fields": (put("config.data_format", ["bytes", "int"]), "'config.data_format' is ['bytes', 'int']"),
    "a time stamp that is a path": (put("updated_at", "../../x"), "'updated_at' is '../../x'"),
    "samples that disagree with shards.json": (
        lambda data: data["chunks"][0].update(chunk_size=11),
        "its chunks hold 11 samples, but shards.json counts 12",
    ),
}


@pytest.mark.parametrize("damage", list(INDEX_DAMAGE))
def test_each_malformed_split_index_is_one_message(shards: Path, damage: str) -> None:
    change, expected = INDEX_DAMAGE[damage]
    edit_json(shards / "train" / "index.json", change)
    with pytest.raises(UserError, match=r"train/index.json' is not what `optimize` writes") as raised:
        read_all(shards)
    assert expected in str(raised.value)


def cut(chunk: Path) -> None:
    chunk.write_bytes(chunk.read_bytes()[:-10])


def bad_count(chunk: Path) -> None:
    data = bytearray(chunk.read_bytes())
    data[0:4] = np.uint32(5).tobytes()
    chunk.write_bytes(bytes(data))


def bad_offsets(chunk: Path) -> None:
    data = bytearray(chunk.read_bytes())
    data[8:12] = np.uint32(10**6).tobytes()  # the second sample starts past the end
    chunk.write_bytes(bytes(data))


def fifo(chunk: Path) -> None:
    chunk.unlink()
    os.mkfifo(chunk)


CHUNK_DAMAGE = {
    "missing": (Path.unlink, "the chunk named in its split's index.json is missing"),
    "cut short": (cut, "(cut or replaced)"),
    "a wrong sample count": (bad_count, "its header counts 5 samples, the index 12"),
    "damaged offsets": (bad_offsets, "its table of sample offsets does not match its size"),
    "a pipe": (fifo, "it is not a regular file"),
}


@pytest.mark.parametrize("damage", list(CHUNK_DAMAGE))
def test_each_damaged_chunk_is_one_message_before_anything_waits_for_it(shards: Path, damage: str) -> None:
    change, expected = CHUNK_DAMAGE[damage]
    change(shards / "train" / "chunk-0-0.bin")
    with pytest.raises(UserError, match=expected):
        read_all(shards)


def test_a_label_outside_the_classes_names_the_sample_as_it_is_read(tmp_path: Path) -> None:
    root = write_shards(tmp_path / "shards")
    items = samples(12, 3)
    items[5]["label"] = 7
    for name in ("chunk-0-0.bin", "index.json"):
        (root / "train" / name).unlink()
    write_split(root / "train", items)
    with pytest.raises(UserError, match=r"sample 5 \(c2/5.jpg\).*its label is 7; expected a class 0..2"):
        read_all(root)


# room: multilabel begin
def test_multilabel_shards_over_class_labels_are_refused_before_training(shards: Path) -> None:
    edit_json(shards / "shards.json", put("task", "multilabel"))
    with pytest.raises(
        UserError, match="field 'label' is stored as 'int'; optimize stores it as 'no_header_numpy"
    ):
        read_all(shards)


# room: multilabel end


def test_a_damaged_sample_inside_a_chunk_is_one_message(shards: Path) -> None:
    chunk = shards / "train" / "chunk-0-0.bin"
    data = bytearray(chunk.read_bytes())
    offset = int(np.frombuffer(data[4:8], np.uint32)[0])
    data[offset : offset + 16] = b"\xff" * 16  # the first sample's field sizes
    chunk.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"sample at position 0\).*its sample cannot be read|its id is"):
        read_all(shards)


def test_fit_on_crafted_shards_is_one_error_line_and_exit_2(
    shards: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_json(shards / "train" / "index.json", put("config.data_format.1", "pickle"))
    assert run_cli("fit", f"--data.root={shards}", "--data.num_workers=0") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: Shards file") and "Fix:" in err[0]
    assert "field 'label' is stored as 'pickle'" in err[0]


def test_shards_that_optimize_did_not_finish_say_so(
    shards: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (shards / "shards.json").unlink()  # written last: a stopped optimize leaves none
    assert run_cli("fit", f"--data.root={shards}", "--data.num_workers=0") == 2
    err = capsys.readouterr().err
    assert "holds shards that `optimize` did not finish: train, val written, no shards.json" in err
