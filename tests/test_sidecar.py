"""The export sidecar as a type: written and read back whole, checked by every reader in one place."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from project.deploy import sidecar as sidecar_module
from project.deploy.sidecar import VERSION, Sidecar
from project.errors import UserError
from tests.exports import DOC


def test_a_sidecar_round_trips_through_its_file(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(Sidecar.from_dict(DOC, path).to_json())
    loaded = Sidecar.load(path)
    assert json.loads(path.read_text()) == DOC and loaded.to_dict() == DOC
    assert loaded == Sidecar.from_dict(json.loads(json.dumps(DOC)), "elsewhere.json")
    assert loaded.class_names == ("red", "green", "blue", "dark")
    assert not loaded.multilabel  # room: multilabel
    assert (loaded.image_size, loaded.crop_ratio, loaded.resize_to) == (16, 0.875, 18)
    assert loaded.temperature == 1.5  # room: calibration
    assert (loaded.unknown_threshold, loaded.unknown_accept) == (5.0, 0.95)  # room: unknown
    assert loaded.files == {"onnx": "m.onnx", "pt2": "m.pt2"} and loaded.version == 1
    assert loaded.interpolation == "bilinear"  # absent: as version 1 resized
    assert loaded.source_checkpoint == "/runs/x/last.ckpt"
    assert loaded.calibration().temperature == 1.5  # room: calibration
    assert loaded.calibration().threshold == 5.0  # room: unknown
    assert loaded.calibration(0.5).threshold == pytest.approx(50.0)  # room: unknown
    assert loaded.public()["source_checkpoint"] == {"sha256": "0" * 64}  # serve shows no folder


def test_a_sidecar_without_a_version_is_version_1() -> None:
    before = {key: value for key, value in DOC.items() if key != "version"}  # written before it had one
    read = Sidecar.from_dict(before, "old.json")
    assert read.version == 1 and read.to_dict() == before


def readers(folder: Path) -> dict[str, Callable[[], object]]:
    """Each reader of an export's sidecar, pointed at `folder/m.json` (beside `m.onnx`, `last.ckpt`)."""
    # room: calibration begin
    from project.callbacks.prediction_writer import export_of

    # room: calibration end
    from project.deploy.classifier import Classifier

    # room: serve begin
    from project.deploy.serve.models import load_model

    # room: serve end
    # room: int8 begin
    from project.export.quantize import quantize_export

    # room: int8 end
    # room: report begin
    # room: calibration begin
    from project.report import write_reliability

    # room: calibration end
    # room: report end

    return {
        "infer": lambda: Classifier(folder / "m.onnx"),
        "serve": lambda: load_model(folder / "m.onnx"),  # room: serve
        # the sidecar of the checkpoint predicted with  # room: calibration
        "predict": lambda: export_of(folder / "last.ckpt"),  # room: calibration
        "quantize": lambda: quantize_export(folder / "m.onnx", datamodule=None),  # room: int8
        # room: report begin
        # room: calibration begin
        "report": lambda: write_reliability(folder / "m.json", folder / "reliability.png"),
        # room: calibration end
        # room: report end
    }


READERS = ["infer"]
READERS.append("predict")  # room: calibration
READERS.append("quantize")  # room: int8
READERS.append("report")  # room: report, calibration
READERS.append("serve")  # room: serve

TAMPERED = {
    # room: calibration begin
    "a negative temperature": (
        {"temperature": -1.0},
        "Sidecar '{json}': 'temperature' is -1.0; expected a finite",
    ),
    # room: calibration end
    # room: unknown begin
    "unknown_accept above 1": (
        {"unknown_accept": 1.5},
        "Sidecar '{json}': 'unknown_accept' is 1.5; expected a",
    ),
    # room: unknown end
    "an unknown resize filter": (
        {"preprocessing": {**DOC["preprocessing"], "interpolation": "lanczos"}},
        "Sidecar '{json}': 'preprocessing.interpolation' is 'lanczos'; expected one of bilinear, bicubic",
    ),
    "a newer version": (
        {"version": VERSION + 1},
        "Sidecar '{json}' was written by a newer version of this template (sidecar version 4; this one "
        "reads up to version 3). Fix: upgrade the project",
    ),
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("case", TAMPERED)
def test_each_reader_refuses_a_tampered_sidecar_through_the_one_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str, case: str
) -> None:
    changes, expected = TAMPERED[case]
    (tmp_path / "m.onnx").write_bytes(b"")  # never opened: the sidecar is refused first
    (tmp_path / "last.ckpt").write_bytes(b"")
    source = {"path": str(tmp_path / "last.ckpt"), "sha256": "0" * 64}
    (tmp_path / "m.json").write_text(json.dumps({**DOC, "source_checkpoint": source, **changes}))
    checked = []
    real_check = sidecar_module.check

    def check(meta: object, path: Path | str) -> None:
        checked.append(Path(path))
        real_check(meta, path)

    monkeypatch.setattr(sidecar_module, "check", check)
    with pytest.raises(UserError) as refused:
        readers(tmp_path)[reader]()
    assert checked == [tmp_path / "m.json"]
    assert expected.format(json=tmp_path / "m.json") in str(refused.value)


def test_every_key_the_rules_check_is_documented() -> None:
    """deploy/sidecar.py's RULES are the one list of checked keys; docs/sidecar.md's table names each."""
    from project.deploy.sidecar import RULES

    page = (Path(__file__).resolve().parents[1] / "docs" / "sidecar.md").read_text()
    documented = set(
        re.findall(r"`([\w.]+)`", "\n".join(line for line in page.splitlines() if line.startswith("| `")))
    )

    # `preprocessing` is named by `preprocessing.crop_ratio`, `feature_bank.k` by `feature_bank`
    def named(key: str) -> bool:
        return any(d == key or d.startswith(key + ".") or key.startswith(d + ".") for d in documented)

    missing = sorted({rule.key for rule in RULES if not named(rule.key)})
    assert RULES and missing == []
