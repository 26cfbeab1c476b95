"""The torch-free `infer` command: every good file answered, every bad one named, any name written."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.test_serve import SRC, tiny_export


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_export(tmp_path_factory.mktemp("model"), "m", seed=0)


def infer(*args: str | bytes, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m project infer ARGS` in a subprocess; fails the test if it imported torch."""
    probe = (
        "import atexit, runpy, sys; sys.argv = ['project', 'infer'] + sys.argv[1:]\n"
        "atexit.register(lambda: 'torch' in sys.modules and print('imported torch', file=sys.stderr))\n"
        "runpy.run_module('project', run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", probe, *args]
    result = subprocess.run(command, capture_output=True, env=env, timeout=120, cwd=cwd)
    assert b"imported torch" not in result.stderr
    return result


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
