"""`export --quantize int8` (project.export.quantize): what its measurement says when it cannot compare.

The int8 exports of real fits are held where those fits are made: tests/test_trust.py (measured, and
answering as the float model), test_export.py and test_timm_backbones.py.
test_multilabel.py holds a multi-label model's.  # room: multilabel
"""

from __future__ import annotations

import json
from pathlib import Path

from project.data.datamodule import ImageDataModule
from project.export import quantize


def test_int8_measurement_when_every_validation_image_is_bad_says_why(tmp_path: Path) -> None:
    """With --data.skip_bad_images every validation image can be left out: nothing to compare, said so."""
    from PIL import Image

    from tests.exports import CLASSES, tiny_export

    model = tiny_export(tmp_path, "m", seed=0)
    for name in CLASSES:
        (tmp_path / "data" / "train" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "data" / "train" / name / "good.png")
        (tmp_path / "data" / "val" / name).mkdir(parents=True)
        (tmp_path / "data" / "val" / name / "bad.jpg").write_bytes(b"not an image")
    data = ImageDataModule(root=str(tmp_path / "data"), skip_bad_images=True, num_workers=0)
    meta = json.loads(model.with_suffix(".json").read_text())
    measured = quantize.measure(model, model, data, meta["image_size"], 0.875, meta)
    assert measured["agreement"] is None and measured["accuracy_int8"] is None
    assert measured["measured"] == (
        "every validation image was skipped as unreadable (--data.skip_bad_images)"
    )
    line = quantize.summary(tmp_path / "m-int8.onnx", measured)
    assert line.startswith(
        f"int8 model {tmp_path / 'm-int8.onnx'}: not compared with float (every validation"
    )
