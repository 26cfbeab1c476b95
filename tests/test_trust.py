"""Trustworthy deployment: the end-of-fit export of a small fit, checked and run.

Its calibrated probabilities and the `unknown` answer.  # room: calibration
Grad-CAM overlays of predict's images.  # room: explain

The int8 export of the fit here is measured and run here too.  # room: int8
"""

from __future__ import annotations

import csv
import json
import re  # room: unknown
from pathlib import Path

import numpy as np
import pytest
import torch  # room: calibration
from PIL import Image

from project.data.shapes import CLASSES

# room: calibration begin
from project.deploy import (
    calibration,
    unknown,  # room: unknown
)

# room: calibration end
from project.deploy.infer import main as infer_main

# room: unknown begin
# room: serve begin
from project.deploy.serve.models import load_model
from project.deploy.serve.predictions import Prepared, answer, run_batch

# room: serve end
# room: unknown end
# room: calibration begin
from project.export import fit_calibration as calibrate

# room: calibration end
# room: report begin
# room: calibration begin
from project.report import write_reliability

# room: calibration end
# room: report end
from tests.helpers import PALETTE, coloured, fast_args, run_cli

# room: calibration begin
CALIBRATION_KEYS = {
    "temperature",
    "ece_before",
    "ece_after",
    "unknown_score",  # room: unknown
    "unknown_accept",  # room: unknown
    "unknown_threshold",  # room: unknown
}
BINS_NEAR_CHANCE = 3  # the reliability bins of top probabilities below 0.2 (chance: 1/6)
# room: calibration end
INT8_KEYS = {"agreement", "accuracy_float", "accuracy_int8", "latency_ms", "quantization"}  # room: int8


# room: calibration begin
def test_the_fitted_temperature_lowers_the_ece_of_overconfident_logits() -> None:
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 5, (2000,), generator=generator)
    logits = torch.randn(2000, 5, generator=generator)
    logits[torch.arange(2000), labels] += 1.5  # about 60% right ...
    logits *= 6  # ... at a confidence near 100%
    temperature = calibrate.fit_temperature(logits, labels)
    before = calibrate.ece(logits.softmax(1), labels)
    after = calibrate.ece(torch.from_numpy(calibration.softmax(logits.numpy(), temperature)), labels)
    assert 3 < temperature < 8  # undoes most of the x6
    assert before > 0.2 and after < 0.03


def test_calibration_is_skipped_with_a_reason(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from project.data.datamodule import ImageDataModule

    missing = ImageDataModule(root=str(tmp_path / "nowhere"))  # a checkpoint's data, not on this machine
    keys = calibrate.calibrate_export(torch.nn.Identity(), missing, 32, 0.875).keys
    assert keys["temperature"] == 1.0
    assert keys["unknown_threshold"] is None  # room: unknown
    assert f"Calibration skipped: the data folder '{tmp_path / 'nowhere'}' is not on this machine" in (
        capsys.readouterr().out
    )
    # room: multilabel begin
    keys = calibrate.calibrate_export(torch.nn.Identity(), missing, 32, 0.875, multilabel=True).keys
    assert "multi-label" in keys["calibration_skipped"]
    # room: multilabel end


# room: calibration end
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, colours_root: Path) -> Path:
    """A fit with its end-of-fit export; returns the run's checkpoint folder."""
    work = tmp_path_factory.mktemp("trust-work")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        flags = [
            "--name=t",
            "--export_best.enabled=true",
            "--export_best.quantize=int8",  # room: int8
            "--trainer.max_epochs=2",
        ]
        assert run_cli("fit", *fast_args(colours_root, *flags)) == 0
    return work / "checkpoints" / "t"


@pytest.fixture(scope="module")
def pngs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image of each class and three photos of something else, as PNGs (lossless: one decode).

    37 px, the size the eval transform resizes to before its 32 px centre crop: no resize, so
    torchvision (predict) and Pillow (infer, serve) see the same pixels. The class images are made at
    32 px and enlarged to 37 here, as the eval transform enlarges the 32 px training images: their
    texture is the training images' (the knn score compares it).
    """
    folder = tmp_path_factory.mktemp("trust-images")
    rng = np.random.default_rng(3)
    for colour, name in zip(PALETTE, CLASSES, strict=True):
        coloured(colour, rng).resize((37, 37), Image.Resampling.BILINEAR).save(folder / f"{name}.png")
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (37, 37, 3), dtype=np.uint8)).save(folder / f"noise{i}.png")
    return folder


# room: calibration begin
@pytest.mark.slow
def test_the_export_records_its_calibration(trained: Path) -> None:
    meta = json.loads((trained / "latest.json").read_text())
    assert set(meta) >= CALIBRATION_KEYS
    # a temperature that keeps the model's answers (not one that flattens them to 1/6, which also
    # lowers the ECE), and an energy threshold on the scale of the logits
    assert calibrate.MIN_TEMPERATURE < meta["temperature"] < calibrate.MAX_TEMPERATURE
    assert meta["ece_after"] <= meta["ece_before"] + 1e-6
    assert meta["reliability"]["after"]["count"][BINS_NEAR_CHANCE:] != [0] * (15 - BINS_NEAR_CHANCE)
    # room: unknown begin
    # the score the made foreign images chose, its threshold one of those measured
    chosen = meta["unknown_score"]
    assert meta["unknown_choice"].startswith(f"{chosen}: at the threshold accepting 95%")
    figures = meta["unknown_scores"]
    assert set(figures) == {"measured_at_accept", "knn", "energy", "max_probability"}
    assert figures[chosen]["foreign_unknown"] == max(figures[s]["foreign_unknown"] for s in unknown.SCORES)
    assert meta["unknown_threshold"] == pytest.approx(figures[chosen]["threshold"])
    assert meta["unknown_accept"] == 0.95 and meta["version"] == (3 if chosen == "knn" else 1)
    assert meta["unknown_threshold"] == pytest.approx(unknown.threshold_for(meta["unknown_quantiles"], 0.95))
    # room: unknown end
    # room: report begin
    png = trained / "reliability.png"
    assert write_reliability(trained / "latest.json", png) and png.stat().st_size > 10_000
    # room: report end


# room: calibration end
def rows(path: Path) -> dict[str, dict]:
    with open(path, newline="") as f:
        return {Path(r["file"]).name: r for r in csv.DictReader(f)}


@pytest.mark.slow
def test_predict_of_the_exports_checkpoint_and_infer_of_the_export_answer_alike(
    trained: Path, pngs: Path, tmp_path: Path, workdir: Path
) -> None:
    meta = json.loads((trained / "latest.json").read_text())
    assert meta["class_names"] == list(CLASSES)
    predicted, inferred = tmp_path / "predict.csv", tmp_path / "infer.csv"
    flags = [f"--ckpt_path={meta['source_checkpoint']['path']}", f"--data.predict_dir={pngs}"]
    flags += ["--data.num_workers=0", f"--predictions.output={predicted}", "--trainer.logger=false"]
    assert run_cli("predict", *flags) == 0
    infer_main(["--model", str(trained / "latest.onnx"), "--output", str(inferred), str(pngs)])
    by_predict, by_infer = rows(predicted), rows(inferred)
    assert set(by_predict) == set(by_infer) == {p.name for p in pngs.iterdir()}
    assert {name: row["class_name"] for name, row in by_predict.items()} == {
        name: row["class_name"] for name, row in by_infer.items()
    }


# room: unknown begin
@pytest.mark.slow
def test_predict_infer_and_serve_answer_unknown_alike(
    trained: Path, pngs: Path, tmp_path: Path, workdir: Path
) -> None:
    # accept half of the validation images: some of these are answered `unknown`, some are not
    ckpt = json.loads((trained / "latest.json").read_text())["source_checkpoint"]["path"]
    predicted, inferred = tmp_path / "predict.csv", tmp_path / "infer.csv"
    flags = [f"--ckpt_path={ckpt}", f"--data.predict_dir={pngs}", "--data.num_workers=0"]
    flags += [
        f"--predictions.output={predicted}",
        "--predictions.unknown_accept=0.5",
        "--trainer.logger=false",
    ]
    assert run_cli("predict", *flags) == 0
    infer_main(
        [
            "--model",
            str(trained / "latest.onnx"),
            "--unknown_accept",
            "0.5",
            "--output",
            str(inferred),
            str(pngs),
        ]
    )
    by_predict, by_infer = rows(predicted), rows(inferred)
    assert set(by_predict) == set(by_infer) == {p.name for p in pngs.iterdir()}
    decisions = {name: row["class_name"] == "unknown" for name, row in by_infer.items()}
    assert 0 < sum(decisions.values()) < len(decisions)
    model = load_model(trained / "latest.onnx", unknown_accept=0.5)  # room: serve
    for name, row in by_infer.items():
        assert by_predict[name]["class_name"] == row["class_name"], name
        for k in (1, 2, 3):
            assert float(by_predict[name][f"top{k}_probability"]) == pytest.approx(
                float(row[f"top{k}_probability"]), abs=1e-4
            )
        # the same reason everywhere: "<score> is below <threshold>, which accepts 50% of ..."
        reason = row["reason"]
        assert same_reason(by_predict[name]["reason"], reason), name
        assert ("accepts 50% of the validation images" in reason) == decisions[name], name
        # room: serve begin
        logits = run_batch([Prepared(model, model.classifier.preprocess(pngs / name), 1, 1, None)])[0][0]
        served = answer(model, logits, 3, 1)
        assert served["class_name"] == row["class_name"]
        assert served["unknown"]["threshold"] == model.classifier.calibration.threshold
        assert same_reason(served["unknown"]["reason"] or "", reason), name
        got = [p["probability"] for p in served["predictions"]]
        assert got == pytest.approx([float(row[f"top{k}_probability"]) for k in (1, 2, 3)], abs=1e-6)
        # room: serve end
    # 0 turns rejection off
    infer_main(
        [
            "--model",
            str(trained / "latest.onnx"),
            "--unknown_accept",
            "0",
            "--output",
            str(inferred),
            str(pngs),
        ]
    )
    assert not [r for r in rows(inferred).values() if r["class_name"] == "unknown"]


def same_reason(a: str, b: str) -> bool:
    """The same words, and numbers within 1e-3: PyTorch (predict), onnxruntime at batch 9 (infer) and at
    batch 1 (serve) round apart in the last digits of a score."""
    number = r"-?\d+\.\d+"
    if re.sub(number, "#", a) != re.sub(number, "#", b):
        return False
    return all(
        abs(float(x) - float(y)) <= 1e-3
        for x, y in zip(re.findall(number, a), re.findall(number, b), strict=True)
    )


# room: unknown end


# room: int8 begin
@pytest.mark.slow
def test_the_int8_export_is_measured_and_runs(trained: Path, pngs: Path) -> None:
    from project.deploy.classifier import Classifier

    int8 = next(trained.glob("t-*-int8.onnx"))
    meta = json.loads(int8.with_suffix(".json").read_text())
    assert set(meta) >= INT8_KEYS
    assert set(meta) >= CALIBRATION_KEYS  # room: calibration
    assert meta["files"] == {"onnx": int8.name} and 0 <= meta["agreement"] <= 1
    assert set(meta["latency_ms"]) == {"float", "int8"} and set(meta["latency_ms"]["int8"]) == {"1", "8"}
    # the int8 model answers as the float one: the same top-1 on the validation images (measured
    # at export) and on these, probabilities within a bound
    assert meta["agreement"] >= 0.9 and meta["validation_images"] == 24
    assert abs(meta["accuracy_int8"] - meta["accuracy_float"]) <= 0.1
    files = sorted(pngs.iterdir())
    full = {kind: Classifier(trained / f"latest{kind}.onnx") for kind in ("", "-int8")}
    answers = {kind: list(c.classify(files, top_k=len(CLASSES))) for kind, c in full.items()}
    assert len(answers["-int8"]) == 9
    for f, q in zip(answers[""], answers["-int8"], strict=True):
        assert sum(q.probabilities) == pytest.approx(1, abs=1e-6)
        float_p = dict(zip(f.names, f.probabilities, strict=True))
        assert max(abs(float_p[c] - p) for c, p in zip(q.names, q.probabilities, strict=True)) < 0.15
    # the same top-1 for the images of the classes but one (noise images, near a tie, may flip)
    pairs = zip(files, answers[""], answers["-int8"], strict=True)
    same = [f.names[0] == q.names[0] for path, f, q in pairs if not path.name.startswith("noise")]
    assert sum(same) >= len(same) - 1, same
    # top_k=2 lists the two largest of those probabilities, in order
    for a, top2 in zip(answers["-int8"], full["-int8"].classify(files, top_k=2), strict=True):
        assert top2.probabilities == pytest.approx(a.probabilities[:2], abs=1e-9)
        assert top2.probabilities[0] >= top2.probabilities[1] and sum(top2.probabilities) <= 1 + 1e-9


# room: int8 end
# room: explain begin
@pytest.mark.slow
def test_predict_explain_writes_an_overlay_per_image(
    trained: Path, pngs: Path, tmp_path: Path, workdir: Path
) -> None:
    ckpt = json.loads((trained / "latest.json").read_text())["source_checkpoint"]["path"]
    flags = [f"--ckpt_path={ckpt}", f"--data.predict_dir={pngs}", "--data.num_workers=0"]
    flags += [f"--predictions.output={tmp_path / 'p.csv'}", f"--explain.dir={tmp_path / 'cam'}"]
    assert run_cli("predict", *flags, "--trainer.logger=false") == 0
    overlays = sorted(p.name for p in (tmp_path / "cam").iterdir())
    assert overlays == sorted(f"{p.name}.cam.png" for p in pngs.iterdir())
    image = np.asarray(Image.open(tmp_path / "cam" / "circle.png.cam.png"))
    assert image.shape == (32, 32, 3) and image.std() > 0


# room: explain end
# room: unknown begin
# room: recipes begin
@pytest.mark.slow
def test_flip_tta_keeps_the_exports_unknown_rule(
    trained: Path, colours_root: Path, tmp_path: Path, workdir: Path
) -> None:
    # the threshold accepts 95% of the validation images; flip TTA must not move them all below it
    ckpt = json.loads((trained / "latest.json").read_text())["source_checkpoint"]["path"]
    unknown, top1 = {}, {}
    for tta in ("none", "flip"):
        output = tmp_path / f"{tta}.csv"
        flags = [f"--ckpt_path={ckpt}", f"--data.predict_dir={colours_root / 'val'}", "--data.num_workers=0"]
        flags += [f"--predictions.output={output}", f"--model.tta={tta}", "--trainer.logger=false"]
        assert run_cli("predict", *flags) == 0
        with open(output, newline="") as f:
            answers = list(csv.DictReader(f))
        assert len(answers) == 24
        unknown[tta] = sum(r["class_name"] == "unknown" for r in answers)
        top1[tta] = np.array([float(r["top1_probability"]) for r in answers])
    assert unknown["none"] <= 3 and unknown["flip"] <= unknown["none"] + 3, unknown
    # the export's temperature applies to flip's logits as to plain ones: confidences alike
    assert abs(top1["flip"].mean() - top1["none"].mean()) < 0.1, (top1["flip"].mean(), top1["none"].mean())


# room: recipes end
# room: unknown end


# room: calibration begin
def test_the_temperature_is_bounded_on_uninformative_logits() -> None:
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 6, (600,), generator=generator)
    logits = torch.randn(600, 6, generator=generator) * 3  # confident, and unrelated to the labels
    temperature = calibrate.fit_temperature(logits, labels)
    assert temperature == pytest.approx(calibrate.MAX_TEMPERATURE)
    always_right = logits * 0.003
    always_right[torch.arange(600), labels] += 0.1  # right by a small margin every time: T towards 0
    assert calibrate.fit_temperature(always_right, labels) == pytest.approx(calibrate.MIN_TEMPERATURE)


def test_a_temperature_that_makes_the_calibration_worse_is_not_kept_and_few_images_are_said() -> None:
    rng = np.random.default_rng(0)
    labels = torch.from_numpy(rng.integers(0, 3, 300))
    # confident where right, unsure where wrong: already well calibrated, a temperature of 5 flattens it
    logits = torch.where(torch.nn.functional.one_hot(labels, 3).bool(), 3.0, 0.0).double()
    logits[:60] = torch.tensor([0.2, 0.1, 0.0], dtype=torch.float64)
    kept = calibrate.checked_calibration(logits, labels, temperature=5.0)
    assert kept["temperature"] == 1.0 and kept["ece_after"] == kept["ece_before"]
    assert "made the calibration error worse" in kept["calibration_note"]
    few = calibrate.checked_calibration(logits[:30], labels[:30], temperature=1.0)
    assert "only 30 validation images" in few["calibration_note"]
    fine = calibrate.checked_calibration(logits, labels, temperature=1.0)
    assert "calibration_note" not in fine


# room: calibration end
