"""The predictions CSV of `predict`: each image once, in file order, whatever its name."""

from __future__ import annotations

import csv
import json  # room: calibration
import os
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from project.callbacks.prediction_writer import (
    PredictionWriter,
    export_of,  # room: calibration
    no_export_message,  # room: calibration
)
from project.csv_cells import original_cell, spreadsheet_cell
from project.data.dataset import FileDataset, collate_skipping_none

# room: calibration begin
from project.errors import UserError

# room: calibration end
from tests.helpers import tiny_trainer

COLOURS = {"red": (230, 20, 20), "green": (20, 230, 20), "blue": (20, 20, 230)}


class MeanColour(L.LightningModule):
    """Logits from an image's mean colour: the class is its dominant channel."""

    class_names = list(COLOURS)
    task = "multiclass"

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return batch[0].float().mean(dim=(2, 3)) / 10


def predict(
    folder: Path,
    names: Sequence[bytes],
    order: list[int],
    output: Path,
    model: L.LightningModule | None = None,
) -> list[dict]:
    """Predict images `names` (one per colour, in turn), visited in `order`; the CSV's rows."""
    files = []
    for i, name in enumerate(names):
        path = Path(os.fsdecode(os.path.join(os.fsencode(folder), name)))
        Image.fromarray(np.full((8, 8, 3), list(COLOURS.values())[i % 3], dtype=np.uint8)).save(path, "PNG")
        files.append(path)
    loader = DataLoader(FileDataset(files, lambda image: image, root=folder), batch_size=2, sampler=order)
    tiny_trainer(PredictionWriter(str(output), top_k=2)).predict(
        model or MeanColour(), loader, return_predictions=False
    )
    with open(output, encoding="utf-8", errors="surrogateescape", newline="") as f:
        return list(csv.DictReader(f))


def test_an_image_visited_twice_is_written_once_in_file_order(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # a distributed sampler pads the last rank's share with images another rank already has
    rows = predict(tmp_path, [b"a.png", b"b.png", b"c.png"], [2, 0, 1, 0, 2], tmp_path / "p.csv")
    assert f"Wrote 3 rows (one per image) to {tmp_path / 'p.csv'}\n" in capsys.readouterr().out
    assert [(r["file"], r["class_name"], r["top1_class"]) for r in rows] == [
        ("a.png", "red", "red"),
        ("b.png", "green", "green"),
        ("c.png", "blue", "blue"),
    ]


def test_a_name_that_is_not_utf8_is_written_with_its_bytes(tmp_path: Path) -> None:
    output = tmp_path / "p.csv"
    rows = predict(tmp_path, [b"caf\xe9.png", b"plain.png"], [0, 1], output)
    assert [r["file"] for r in rows] == [os.fsdecode(b"caf\xe9.png"), "plain.png"]
    assert output.read_bytes().splitlines()[1].startswith(b"caf\xe9.png,red,")
    assert not list(tmp_path.glob(".p.csv*"))


class FormulaNames(MeanColour):
    class_names = ['=HYPERLINK("http://evil.example","x")', "-green", "'=blue"]


def test_names_that_a_spreadsheet_would_evaluate_are_written_as_text(tmp_path: Path) -> None:
    output = tmp_path / "p.csv"
    rows = predict(tmp_path, [b"=1+2.png", b"@sum.png", b"'+c.png"], [0, 1, 2], output, FormulaNames())
    cells = [(r["file"], r["class_name"], r["top1_class"]) for r in rows]
    assert cells == [
        ("'=1+2.png", '\'=HYPERLINK("http://evil.example","x")', '\'=HYPERLINK("http://evil.example","x")'),
        ("'@sum.png", "'-green", "'-green"),
        ("''+c.png", "''=blue", "''=blue"),
    ]
    assert [original_cell(r["file"]) for r in rows] == ["=1+2.png", "@sum.png", "'+c.png"]


def test_every_text_comes_back_exactly_from_its_cell() -> None:
    texts = ["=a", "+a", "-1", "@a", "\ta", "\ra", "'=a", "''-a", "'a", "''a", "a=b", "", "'", "plain"]
    cells = [spreadsheet_cell(t) for t in texts]
    assert cells[:7] == ["'=a", "'+a", "'-1", "'@a", "'\ta", "'\ra", "''=a"]
    assert cells[8:] == texts[8:]  # nothing a spreadsheet evaluates: unchanged
    assert [original_cell(c) for c in cells] == texts


def test_an_image_refused_by_decoding_is_skipped_and_the_others_written(tmp_path: Path) -> None:
    for name, rgb in (("a.png", COLOURS["red"]), ("c.png", COLOURS["blue"])):
        Image.fromarray(np.full((8, 8, 3), rgb, dtype=np.uint8)).save(tmp_path / name)
    Image.new("L", (1, 1_000_000)).save(tmp_path / "b-line.png")  # 2 kB; 7 GB once resized
    files = [tmp_path / "a.png", tmp_path / "b-line.png", tmp_path / "c.png"]
    dataset = FileDataset(files, lambda image: image[:, :8, :8], skip_bad_images=True, root=tmp_path)
    loader = DataLoader(dataset, batch_size=2, collate_fn=collate_skipping_none)
    with pytest.warns(UserWarning, match=r"b-line.png': it is 1x1000000 pixels, an aspect ratio beyond"):
        tiny_trainer(PredictionWriter(str(tmp_path / "p.csv"))).predict(MeanColour(), loader)
    with open(tmp_path / "p.csv") as f:
        assert [(r["file"], r["class_name"]) for r in csv.DictReader(f)] == [
            ("a.png", "red"),
            ("c.png", "blue"),
        ]


# room: calibration begin
GOOD_SIDECAR = {"class_names": list(COLOURS), "image_size": 8, "preprocessing": {"crop_ratio": 1.0}}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"temperature": -2.0}, r"Sidecar '.*s.json': 'temperature' is -2.0; expected a finite number > 0"),
        # room: unknown begin
        ({"unknown_threshold": float("nan")}, r"'unknown_threshold' is nan; expected a finite number"),
        # room: unknown end
        ({"class_names": "red"}, r"'class_names' is 'red'; expected a list of the class names"),
        (
            {"class_names": ["red", "green"]},
            r"sidecar '.*s.json' names 2 classes .*the checkpoint's model has 3",
        ),
    ],
)
def test_a_sidecar_that_does_not_fit_stops_predict_naming_the_key(
    tmp_path: Path, changes: dict, expected: str
) -> None:
    sidecar = tmp_path / "s.json"
    sidecar.write_text(json.dumps({**GOOD_SIDECAR, **changes}))
    Image.fromarray(np.full((8, 8, 3), COLOURS["red"], dtype=np.uint8)).save(tmp_path / "a.png")
    loader = DataLoader(FileDataset([tmp_path / "a.png"], lambda image: image, root=tmp_path), batch_size=1)
    writer = PredictionWriter(str(tmp_path / "p.csv"), sidecar=str(sidecar))
    with pytest.raises(UserError, match=expected):
        tiny_trainer(writer).predict(MeanColour(), loader, return_predictions=False)
    assert not (tmp_path / "p.csv").exists()


def test_last_ckpt_uses_the_export_of_a_checkpoint_with_its_weights_or_names_the_files(
    tmp_path: Path,
) -> None:
    weights = {"net.weight": torch.arange(6.0).reshape(2, 3), "net.bias": torch.zeros(2)}
    # last.ckpt after a fit whose last epoch was the best: the best's weights, other training state
    torch.save({"state_dict": weights, "epoch": 3}, tmp_path / "epoch=3-val_acc=0.9.ckpt")
    torch.save(
        {"state_dict": {k: v.clone() for k, v in weights.items()}, "epoch": 3, "loops": {}},
        tmp_path / "last.ckpt",
    )
    changed = {**weights, "net.bias": torch.ones(2)}
    torch.save({"state_dict": changed, "epoch": 1}, tmp_path / "epoch=1-val_acc=0.5.ckpt")
    best = tmp_path / "epoch=3-val_acc=0.9.ckpt"
    sidecar = {**GOOD_SIDECAR, "temperature": 2.5, "source_checkpoint": {"path": str(best)}}
    (tmp_path / "run-export.json").write_text(json.dumps(sidecar))
    found = export_of(tmp_path / "last.ckpt")
    assert found is not None and found.temperature == 2.5 and found.source_checkpoint == str(best)
    other = tmp_path / "epoch=1-val_acc=0.5.ckpt"
    assert export_of(other) is None  # different weights: the export does not calibrate it
    said = no_export_message(other)
    assert f"The run's export '{tmp_path / 'run-export.json'}' is of '{best}', whose weights differ." in said
    assert f"Pass --ckpt_path={best} to predict with the exported model" in said
    assert f"(python -m project export --ckpt_path {other})" in said


# room: calibration end


def test_without_an_output_each_predict_writes_a_new_csv_in_the_runs_folder(
    workdir: Path, capsys: pytest.CaptureFixture
) -> None:
    """Before: `./predictions.csv` in the working folder, replaced by every later predict of any run."""
    from lightning.pytorch.loggers import TensorBoardLogger

    images = workdir / "images"
    images.mkdir()
    files = []
    for i, colour in enumerate(COLOURS.values()):
        files.append(images / f"{i}.png")
        Image.fromarray(np.full((8, 8, 3), colour, dtype=np.uint8)).save(files[-1])
    written = []
    for _ in range(2):
        logger = TensorBoardLogger("logs", name="run", version="predict")  # as the CLI sets it for predict
        loader = DataLoader(FileDataset(files, lambda image: image, root=images), batch_size=2)
        tiny_trainer(PredictionWriter(top_k=2), logger=logger).predict(
            MeanColour(), loader, return_predictions=False
        )
        said = capsys.readouterr().out
        written.append(Path(said.split("Wrote 3 rows (one per image) to ")[1].split("\n")[0]))
    folder = Path("logs") / "run" / "predict"
    assert [p.parent for p in written] == [folder, folder] and written[0] != written[1]
    assert all(p.name.startswith("predictions-") and p.suffix == ".csv" for p in written)
    assert sorted(folder.glob("predictions-*.csv")) == sorted(written)  # the first one kept
    assert not list(workdir.glob("*.csv"))


# room: unknown begin
def test_each_batch_takes_its_own_first_view_after_another_callbacks_pass() -> None:
    """A callback that runs the network after predict_step (Grad-CAM does) leaves an output behind; the
    next batch's verdict must come from that batch's own plain view, not from the left-over pass."""
    from project.callbacks.prediction_writer import FirstView

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    writer = PredictionWriter()
    writer._first_view = FirstView(net, features=False)
    first, second = torch.rand(2, 3, 2, 2), torch.rand(4, 3, 2, 2)
    writer.on_predict_batch_start(None, None, first, 0)
    expected_first = net(first)
    net(first)  # another callback's pass after predict_step
    assert np.array_equal(writer._first_view.take(first).logits, expected_first.detach().numpy())
    net(first)  # and again once this batch's view is taken
    writer.on_predict_batch_start(None, None, second, 1)
    expected_second = net(second)
    assert np.array_equal(writer._first_view.take(second).logits, expected_second.detach().numpy())


# room: unknown end
