"""The torch-free `infer` command: every good file answered, every bad one named, any name written."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from project.deploy.infer import main as infer_main
from tests.exports import infer, tiny_export


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_export(tmp_path_factory.mktemp("model"), "m", seed=0)


def colour(path: Path, rgb: tuple[int, int, int]) -> Path:
    Image.new("RGB", (20, 14), rgb).save(path)
    return path


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """Two good images and three bad ones (empty, not an image, truncated) in one folder."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    colour(folder / "a-red.png", (230, 20, 20))
    colour(folder / "e-blue.jpg", (20, 20, 230))
    (folder / "b-empty.jpg").write_bytes(b"")
    (folder / "c-text.png").write_bytes(b"not an image at all\n" * 10)
    (folder / "d-truncated.jpg").write_bytes((folder / "e-blue.jpg").read_bytes()[:200])
    return folder


def test_bad_files_are_named_and_the_good_ones_answered(model: Path, mixed: Path, tmp_path: Path) -> None:
    output = tmp_path / "out.csv"
    result = infer("--model", str(model), "--output", str(output), str(mixed))
    assert result.returncode == 1, result.stderr
    with open(output) as f:
        rows = list(csv.DictReader(f))
    answered = [(Path(r["file"]).name, r["class_name"]) for r in rows]
    assert answered == [("a-red.png", "red"), ("e-blue.jpg", "blue")]
    assert result.stdout.decode() == f"Wrote 2 rows (one per image answered) to {output}\n"
    errors = result.stderr.decode().splitlines()
    assert "Traceback" not in result.stderr.decode()
    named = [line for line in errors if line.startswith("error: cannot classify")]
    assert len(named) == 3
    assert f"'{mixed / 'b-empty.jpg'}': the file is empty" in named[0]
    assert f"'{mixed / 'c-text.png'}': cannot identify an image" in named[1]
    assert f"'{mixed / 'd-truncated.jpg'}': " in named[2]
    assert errors[-1].startswith("error: 3 of 5 files could not be classified")
    assert not list(tmp_path.glob(".out.csv*"))  # no partial file left


def test_printing_also_answers_every_good_file(model: Path, mixed: Path) -> None:
    result = infer("--model", str(model), "--top_k", "1", str(mixed))
    assert result.returncode == 1
    lines = result.stdout.decode().splitlines()
    assert [Path(line.split("\t")[0]).name for line in lines] == ["a-red.png", "e-blue.jpg"]
    assert result.stderr.decode().count("error: cannot classify") == 3


def test_all_good_files_exit_zero(model: Path, tmp_path: Path) -> None:
    good = colour(tmp_path / "red.png", (230, 20, 20))
    result = infer("--model", str(model), str(good))
    assert result.returncode == 0 and result.stderr == b""
    assert result.stdout.decode().startswith(f"{good}\tred ")


def test_a_name_that_is_not_utf8_keeps_its_bytes(model: Path, tmp_path: Path) -> None:
    folder = os.fsencode(tmp_path / "latin1")
    os.mkdir(folder)
    name = os.path.join(folder, b"caf\xe9.png")
    Image.fromarray(np.full((14, 20, 3), (20, 210, 40), dtype=np.uint8)).save(os.fsdecode(name))
    output = tmp_path / "out.csv"
    result = infer("--model", str(model), "--output", str(output), os.fsdecode(folder))
    assert result.returncode == 0, result.stderr
    lines = output.read_bytes().splitlines()
    assert lines[1].startswith(name + b",green,")  # the name's own bytes, as the file system holds it
    with open(output, encoding="utf-8", errors="surrogateescape") as f:
        assert [row["file"] for row in csv.DictReader(f)] == [os.fsdecode(name)]
    printed = infer("--model", str(model), os.fsdecode(folder))
    assert printed.returncode == 0 and printed.stdout.startswith(name + b"\tgreen ")


NAN = float("nan")
BAD_SIDECARS = {  # case -> (keys changed, what the error names)
    # room: calibration begin
    "temperature below 0": (
        {"temperature": -1.0},
        "Sidecar '{json}': 'temperature' is -1.0; expected a finite",
    ),
    "temperature 0": ({"temperature": 0}, "'temperature' is 0; expected a finite number > 0"),
    "temperature NaN": ({"temperature": NAN}, "'temperature' is nan; expected a finite number > 0"),
    # room: calibration end
    # room: multilabel begin
    "threshold NaN": ({"task": "multilabel", "threshold": NAN}, "'threshold' is nan; expected a probability"),
    # room: multilabel end
    # room: unknown begin
    "unknown threshold NaN": ({"unknown_threshold": NAN}, "'unknown_threshold' is nan; expected a finite"),
    "unknown score": (
        {"unknown_score": "entropy"},
        "'unknown_score' is 'entropy'; expected one of knn, energy",
    ),
    "quantiles": ({"unknown_quantiles": [1.0, 0.0]}, "'unknown_quantiles' is [1.0, 0.0]; expected 101"),
    # room: unknown end
    "class names as a string": (
        {"class_names": "red"},
        "'class_names' is 'red'; expected a list of the class",
    ),
    "class names twice": ({"class_names": ["red", "red", "b", "d"]}, "'class_names' is ['red', 'red', "),
    "crop ratio 0": (
        {"preprocessing": {"crop_ratio": 0}},
        "'preprocessing.crop_ratio' is 0; expected a number",
    ),
    "crop ratio near 0": ({"preprocessing": {"crop_ratio": 1e-9}}, "'preprocessing.crop_ratio' is 1e-09;"),
    "image size 0": ({"image_size": 0}, "'image_size' is 0; expected a whole number of pixels"),
    "image size as text": ({"image_size": "16"}, "'image_size' is '16'; expected a whole number"),
    "task": ({"task": "regression"}, "'task' is 'regression'; expected one of multiclass"),
    "too few class names": (
        {"class_names": ["red", "green", "blue"]},
        "Model '{onnx}' gives 4 logits per image, but its sidecar '{json}' names 3 classes in 'class_names'",
    ),
    "image size the model does not take": ({"image_size": 24}, "Model '{onnx}' does not take the input"),
}


@pytest.mark.parametrize("case", BAD_SIDECARS)
def test_a_sidecar_value_out_of_range_is_one_error_naming_the_key(
    model: Path, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    changes, expected = BAD_SIDECARS[case]
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(model.read_bytes())
    sidecar = json.loads(model.with_suffix(".json").read_text())
    (tmp_path / "m.json").write_text(json.dumps({**sidecar, **changes}))
    image = colour(tmp_path / "red.png", (230, 20, 20))
    with pytest.raises(SystemExit) as exited:
        infer_main(["--model", str(onnx), str(image)])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ")
    assert expected.format(onnx=onnx, json=tmp_path / "m.json") in err
    assert "Fix: " in err


@pytest.mark.parametrize("top_k", ["0", "-1"])
def test_top_k_below_1_is_refused(model: Path, tmp_path: Path, top_k: str) -> None:
    image = colour(tmp_path / "red.png", (230, 20, 20))
    result = infer("--model", str(model), "--top_k", top_k, "--output", str(tmp_path / "out.csv"), str(image))
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode() == (
        f"error: --top_k {top_k} is not a number of classes to list: it must be 1 or more. "
        "Fix: pass e.g. --top_k 5 (a number above the model's classes lists them all).\n"
    )
    assert not (tmp_path / "out.csv").exists()


def test_top_k_above_the_classes_lists_them_all(model: Path, tmp_path: Path) -> None:
    image = colour(tmp_path / "red.png", (230, 20, 20))
    output = tmp_path / "out.csv"
    assert infer("--model", str(model), "--top_k", "50", "--output", str(output), str(image)).returncode == 0
    with open(output) as f:
        header, row = list(csv.reader(f))
    columns = ["top4_class", "top4_probability"]
    columns.append("reason")  # room: unknown
    assert header[-len(columns) :] == columns and len(row) == len(header)
    assert sorted(row[3:11:2]) == ["blue", "dark", "green", "red"]


def test_names_that_a_spreadsheet_would_evaluate_are_written_as_text(tmp_path: Path) -> None:
    model = tiny_export(tmp_path, "m", seed=0)
    sidecar = model.with_suffix(".json")
    meta = json.loads(sidecar.read_text())
    meta["class_names"] = ['=HYPERLINK("http://evil.example","x")', "+green", "@blue", "dark"]
    sidecar.write_text(json.dumps(meta))
    folder = tmp_path / "in"
    folder.mkdir()
    colour(folder / "=1+2.png", (230, 20, 20))
    output = tmp_path / "out.csv"
    result = infer("--model", str(model), "--output", str(output), "--top_k", "2", str(folder))
    assert result.returncode == 0, result.stderr
    with open(output, newline="") as f:
        [row] = list(csv.DictReader(f))
    assert row["file"] == str(folder / "=1+2.png")  # an absolute path starts with /: nothing to guard
    assert row["class_name"] == row["top1_class"] == '\'=HYPERLINK("http://evil.example","x")'
    relative = infer("--model", str(model), "--output", str(output), "=1+2.png", cwd=folder)
    assert relative.returncode == 0, relative.stderr
    with open(output, newline="") as f:
        assert next(csv.DictReader(f))["file"] == "'=1+2.png"


def test_a_bad_file_with_control_characters_is_named_escaped(model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad\x1b]0;owned\x07\nerror: forged.png"
    bad.write_bytes(b"not an image")
    result = infer("--model", str(model), str(bad))
    err = result.stderr.decode()
    assert result.returncode == 1 and "\x1b" not in err and "\x07" not in err
    assert (
        f"error: cannot classify '{tmp_path}/bad\\x1b]0;owned\\x07\\nerror: forged.png': cannot identify"
        in err
    )
    assert len(err.splitlines()) == 2  # that file's line and the summary: no forged line


def test_the_readme_says_where_infer_writes(model: Path, tmp_path: Path) -> None:
    """Before: the README's table said `infer` writes "to a CSV"; without --output it prints to stdout."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `infer` |"))
    assert "on stdout" in row and "a CSV with `--output`" in row
    good = colour(tmp_path / "red.png", (230, 20, 20))
    result = infer("--model", str(model), str(good), cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.decode().startswith(f"{good}\tred ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["red.png"]  # no file written
