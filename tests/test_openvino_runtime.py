"""An OpenVINO IR in `infer` (and `serve`): the same answers as its ONNX file, torch-free, one error line."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from project.deploy.classifier import Classifier
from project.deploy.infer import main as infer_main

# room: serve begin
from project.deploy.serve.command import main as serve_main

# room: serve end
from tests.exports import (
    CLASSES,
    SIZE,
    encode,  # room: serve
    infer,
    tiny_export,
)
from tests.servers import Server, predict  # room: serve

pytest.importorskip("openvino")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`m.onnx`; `m.xml` + `m.bin` converted from it as `export --format openvino` does; `m.json`."""
    from project.export.openvino_target import write_ir

    folder = tmp_path_factory.mktemp("openvino")
    onnx_path = tiny_export(folder, "m", seed=0)
    write_ir(onnx_path, folder / "m.xml", folder / "m.bin")
    meta = json.loads((folder / "m.json").read_text())
    meta["files"]["openvino"] = "m.xml"
    (folder / "m.json").write_text(json.dumps(meta))
    return folder


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six images, one per colour and a few in between, so that every class is someone's top-1."""
    folder = tmp_path_factory.mktemp("images")
    colours = [(230, 20, 20), (20, 230, 20), (20, 20, 230), (10, 10, 10), (200, 180, 40), (90, 90, 200)]
    for i, rgb in enumerate(colours):
        Image.new("RGB", (24, 18), rgb).save(folder / f"{i}.png")
    return folder


def rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path) as f:
        return {Path(row["file"]).name: row for row in csv.DictReader(f)}


def test_infer_with_the_ir_answers_as_with_the_onnx_file_without_torch(
    exported: Path, images: Path, tmp_path: Path
) -> None:
    for suffix in ("onnx", "xml"):  # `infer` fails the test if it imported torch
        result = infer(
            "--model", str(exported / f"m.{suffix}"), "--output", str(tmp_path / f"{suffix}.csv"), str(images)
        )
        assert result.returncode == 0, result.stderr
    by_onnx, by_ir = rows(tmp_path / "onnx.csv"), rows(tmp_path / "xml.csv")
    assert len(by_ir) == 6 and by_ir.keys() == by_onnx.keys()
    assert {row["class_name"] for row in by_ir.values()} == set(CLASSES)  # every class is answered
    for name, row in by_ir.items():
        assert row["class_name"] == by_onnx[name]["class_name"]
        for rank in range(1, len(CLASSES) + 1):  # every class's probability, in the same order
            assert row[f"top{rank}_class"] == by_onnx[name][f"top{rank}_class"]
            probability = float(row[f"top{rank}_probability"])
            assert abs(probability - float(by_onnx[name][f"top{rank}_probability"])) <= 1e-5


def test_the_ir_runs_batches_from_several_threads_at_once(exported: Path) -> None:
    classifier = Classifier(exported / "m.xml")
    batches = [np.random.default_rng(i).integers(0, 256, (i + 1, 3, SIZE, SIZE), np.uint8) for i in range(8)]
    alone = [classifier.logits(batch) for batch in batches]
    with ThreadPoolExecutor(4) as pool:  # batches in threads, as a service runs them
        together = list(pool.map(classifier.logits, batches * 4))
    for i, logits in enumerate(together):
        np.testing.assert_array_equal(logits, alone[i % len(batches)])


# room: serve begin
@pytest.mark.slow
def test_serve_answers_from_the_ir_without_torch(exported: Path, images: Path, tmp_path: Path) -> None:
    server = Server(exported / "m.xml", log=tmp_path / "server.log")
    try:
        status, answer = predict(server.port, encode(Image.open(images / "3.png"), "PNG"), "image/png")
    finally:
        assert server.stop() == 0
    expected = next(Classifier(exported / "m.onnx").classify([images / "3.png"], top_k=5))
    assert status == 200 and answer["version"] == "m"
    assert answer["class_name"] == expected.names[0] == "dark"
    served = [p["probability"] for p in answer["predictions"]]
    np.testing.assert_allclose(served, expected.probabilities, atol=1e-5)
    assert "imported torch: False" in server.log()


# room: serve end
def test_without_openvino_an_ir_is_one_error_line(
    exported: Path, images: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    needs = (
        f"error: Running the OpenVINO model '{exported / 'm.xml'}' needs the `openvino` package, which is "
        "not installed. Fix: pip install -e '.[openvino]' (or pip install openvino)."
    )
    with pytest.raises(SystemExit) as exited:
        infer_main(["--model", str(exported / "m.xml"), str(images)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [needs]
    # room: serve begin
    with pytest.raises(SystemExit) as served:
        serve_main(["--model", str(exported / "m.xml"), "--port", "0"])
    assert served.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [needs]
    # room: serve end


def test_an_ir_whose_weights_are_missing_is_one_error_naming_it(
    exported: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    for ext in ("xml", "json"):
        (tmp_path / f"m.{ext}").write_bytes((exported / f"m.{ext}").read_bytes())
    with pytest.raises(SystemExit) as exited:
        infer_main(["--model", str(tmp_path / "m.xml"), str(tmp_path)])
    assert exited.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: OpenVINO cannot load '{tmp_path / 'm.xml'}': ")
    fix = "export the checkpoint again with `python -m project export --format openvino`, and keep its"
    assert line.endswith(f"Fix: {fix} .xml and .bin together.")


def test_weights_that_are_a_fifo_are_refused_at_once(exported: Path, tmp_path: Path) -> None:
    """OpenVINO opens the .bin and waits for a writer: a FIFO hung the load, as it would an image's."""
    for ext in ("xml", "json"):
        (tmp_path / f"m.{ext}").write_bytes((exported / f"m.{ext}").read_bytes())
    os.mkfifo(tmp_path / "m.bin")
    command = [sys.executable, "-m", "project", "infer", "--model", str(tmp_path / "m.xml"), str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: OpenVINO cannot load '{tmp_path / 'm.bin'}': it is not a regular file")
    assert " Fix: export the checkpoint again" in line
