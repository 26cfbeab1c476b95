"""The feature-space `unknown` score: its bank of training features, read as data and checked; the score
chosen by measurement on made foreign images; the same verdict from every path."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.data.shapes import CLASSES
from project.deploy import feature_bank, unknown
from project.deploy.calibration import Calibration
from project.deploy.feature_bank import FeatureBank
from project.deploy.infer import main as infer_main
from project.deploy.outputs import Outputs

# room: serve begin
from project.deploy.serve.models import load_model
from project.deploy.serve.predictions import Prepared, answer, run_batch

# room: serve end
from project.deploy.sidecar import Sidecar
from project.errors import UserError
from project.export import fit_calibration, fit_unknown
from project.export.foreign import PER_KIND, foreign_images
from tests.exports import DOC as SIDECAR
from tests.exports import tiny_export, with_unknown_keys

STATISTICS = sum(width for _, width in feature_bank.IMAGE_BLOCKS)  # the image's own columns: 72


def descriptor_rows(rng: np.random.Generator, n: int, features: int = 8) -> np.ndarray:
    """Descriptors of `n` random images: `features` network features beside their image statistics."""
    images = rng.integers(0, 256, (n, 3, 16, 16), dtype=np.uint8)
    return feature_bank.descriptors(rng.normal(size=(n, features)), images)


def test_the_knn_similarity_of_each_block_is_the_cosine_similarity_to_the_kth_nearest_row() -> None:
    rng = np.random.default_rng(0)
    rows = descriptor_rows(rng, 50)
    bank = FeatureBank.of(rows)
    assert bank.blocks == (("features", 8), ("gradients", 8), ("colours", 64))
    queries = descriptor_rows(rng, 6)
    queries[:, :8] *= 7.0  # the length of a block does not matter
    for name, start, width in (("features", 0, 8), ("gradients", 8, 8), ("colours", 16, 64)):
        brute = []
        for q in queries[:, start : start + width]:
            block = rows[:, start : start + width]
            similarity = sorted((q / np.linalg.norm(q)) @ (r / np.linalg.norm(r)) for r in block)[::-1]
            brute.append(similarity[feature_bank.K - 1])
        np.testing.assert_allclose(bank.similarities(queries)[name], brute, atol=2e-3)  # float16 rows
    # the score: each block standardized by its validation mean and spread, summed
    fitted = bank.standardized(descriptor_rows(rng, 30))
    expected = sum(
        (s - fitted.standardize[name][0]) / fitted.standardize[name][1]
        for name, s in bank.similarities(queries).items()
    )
    np.testing.assert_allclose(fitted.scores(queries), expected)


def test_the_image_statistics_tell_flat_colours_from_texture() -> None:
    flat = np.full((1, 3, 16, 16), 200, dtype=np.uint8)
    noise = np.random.default_rng(0).integers(0, 256, (1, 3, 16, 16), dtype=np.uint8)
    stats = feature_bank.image_statistics(np.concatenate([flat, noise]))
    assert stats.shape == (2, STATISTICS)
    gradients, colours = stats[:, :8] ** 2, stats[:, 8:] ** 2  # shares: square roots are stored
    assert gradients[0, 0] == 1.0 and gradients[1, 0] < 0.1  # flat: every step under 2 grey levels
    assert colours[0].max() == 1.0 and (colours[1] > 0).sum() > 30  # one cell against many
    np.testing.assert_allclose(np.linalg.norm(stats[:, :8], axis=1), 1, atol=1e-6)


def test_a_bank_is_bounded_by_rows_and_bytes() -> None:
    assert feature_bank.rows_for(512, 100_000) == feature_bank.MAX_ROWS
    assert feature_bank.rows_for(512, 300) == 300
    wide = feature_bank.rows_for(8192, 100_000)  # 2 bytes a feature: fewer rows within MAX_BYTES
    assert wide * 8192 * 2 <= feature_bank.MAX_BYTES < (wide + 1) * 8192 * 2


def written(folder: Path, rows: np.ndarray, name: str = "m.features.npy") -> tuple[Path, dict]:
    """A bank file of `rows` as export writes it, and the sidecar's description of it."""
    bank = FeatureBank.of(rows).standardized(rows)
    data = bank.to_bytes()
    (folder / name).write_bytes(data)
    return folder / name, feature_bank.describe(bank, name, data)


def test_a_bank_file_is_read_back_as_written(tmp_path: Path) -> None:
    rows = descriptor_rows(np.random.default_rng(1), 20, features=4)
    path, described = written(tmp_path, rows)
    loaded = FeatureBank.load(path, described, tmp_path / "m.json")
    np.testing.assert_allclose(loaded.rows, FeatureBank.of(rows).rows)
    assert loaded.standardize == FeatureBank.of(rows).standardized(rows).standardize  # via JSON: exact
    assert described["rows"] == 20 and described["dim"] == 4 + STATISTICS
    assert described["bytes"] == path.stat().st_size


def test_a_pickled_bank_runs_nothing_and_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    buffer = io.BytesIO()
    np.save(buffer, np.array([Payload()], dtype=object), allow_pickle=True)
    data = buffer.getvalue()
    path = tmp_path / "m.features.npy"
    path.write_bytes(data)
    described = {"file": path.name, "rows": 1, "dim": 1, "sha256": hashlib.sha256(data).hexdigest()}
    with pytest.raises(UserError, match=r"is not a plain \.npy array"):
        FeatureBank.load(path, described, "m.json")
    assert not marker.exists()
    assert pickle.dumps(0)  # pickle itself works here: the bank was refused, not pickle broken


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("sha256", "does not have the sha256 the sidecar records"),
        ("shape", "expected float16 (20, 77)"),
        ("nan", "holds rows whose blocks are not finite vectors of length 1"),
        ("length", "holds rows whose blocks are not finite vectors of length 1"),
        ("missing", "does not exist"),
        ("fifo", "is not a regular file"),
    ],
)
def test_a_bank_that_is_not_what_the_sidecar_describes_is_refused(
    tmp_path: Path, change: str, message: str
) -> None:
    path, described = written(tmp_path, descriptor_rows(np.random.default_rng(2), 20, features=4))
    rows = np.load(path)
    if change == "sha256":
        described["sha256"] = "0" * 64
    elif change == "shape":
        described["dim"] = 77
    elif change in ("nan", "length"):
        rows[3, 1] = np.nan if change == "nan" else 3.0
        buffer = io.BytesIO()
        np.save(buffer, rows, allow_pickle=False)
        path.write_bytes(buffer.getvalue())
        described["sha256"] = hashlib.sha256(buffer.getvalue()).hexdigest()
    elif change == "missing":
        path.unlink()
    else:
        path.unlink()
        os.mkfifo(path)
    with pytest.raises(UserError, match=re.escape(message)) as error:
        FeatureBank.load(path, described, tmp_path / "m.json")
    assert f"Feature bank '{path}' (named by sidecar '{tmp_path / 'm.json'}')" in str(error.value)


KNN_SIDECAR = {
    **SIDECAR,
    "version": 3,
    "unknown_score": "knn",
    "unknown_quantiles": [q / 100 for q in range(101)],
    "unknown_threshold": 0.05,
    "feature_bank": {
        "file": "m.features.npy",
        "rows": 20,
        "dim": 4 + STATISTICS,
        "k": 5,
        "sha256": "a" * 64,
        "standardize": {"features": [0.5, 0.1], "gradients": [0.9, 0.05], "colours": [0.7, 0.1]},
    },
}


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"feature_bank": None}, "'feature_bank' is None; expected the training features file the knn"),
        (
            {"feature_bank": {**KNN_SIDECAR["feature_bank"], "file": "../x.features.npy"}},
            "'feature_bank.file'",
        ),
        (
            {"feature_bank": {**KNN_SIDECAR["feature_bank"], "file": "/tmp/m.features.npy"}},
            "'feature_bank.file'",
        ),
        ({"feature_bank": {**KNN_SIDECAR["feature_bank"], "file": "m.pkl"}}, "'feature_bank.file'"),
        ({"feature_bank": {**KNN_SIDECAR["feature_bank"], "rows": 10**6}}, "'feature_bank.rows'"),
        ({"feature_bank": {**KNN_SIDECAR["feature_bank"], "dim": True}}, "'feature_bank.dim'"),
        ({"feature_bank": {**KNN_SIDECAR["feature_bank"], "k": 50}}, "'feature_bank.k' is 50; expected 5"),
        ({"feature_bank": {**KNN_SIDECAR["feature_bank"], "sha256": "x"}}, "'feature_bank.sha256'"),
        ({"feature_bank": {**KNN_SIDECAR["feature_bank"], "dim": 50}}, "'feature_bank.dim' is 50; expected"),
        (
            {"feature_bank": {**KNN_SIDECAR["feature_bank"], "standardize": {"features": [0.5, 0]}}},
            "'feature_bank.standardize'",
        ),
    ],
)
def test_a_sidecar_feature_bank_entry_is_checked(keys: dict, message: str) -> None:
    with pytest.raises(UserError, match=re.escape(message)):
        Sidecar.from_dict({**KNN_SIDECAR, **keys}, "m.json")


def test_an_older_reader_is_told_to_upgrade_for_a_knn_export() -> None:
    from project.deploy.sidecar import version_for

    assert version_for("bilinear", "knn") == 3 == version_for("bicubic", "knn")
    assert version_for("bilinear", "energy") == 1 and version_for("bicubic", None) == 2


def test_the_foreign_images_are_fixed_and_of_every_kind() -> None:
    validation = [torch.full((3, 32, 32), i * 20, dtype=torch.uint8) for i in range(5)]
    made = foreign_images(32, validation, ["cat", "dog"])
    assert set(made) == {"noise", "flat", "smooth", "shuffled", "shapes"}
    assert all(
        images.shape == (PER_KIND, 3, 32, 32) and images.dtype == torch.uint8 for images in made.values()
    )
    again = foreign_images(32, validation, ["cat", "dog"])
    assert all(torch.equal(made[k], again[k]) for k in made)
    # a model of the shapes is not shown the shapes as foreign; no validation images, no shuffled tiles
    assert set(foreign_images(32, [], CLASSES)) == {"noise", "flat", "smooth"}


def evidence(
    foreign_logits: np.ndarray, foreign_features: np.ndarray, features: np.ndarray
) -> fit_unknown.Evidence:
    bank = FeatureBank.of(features).standardized(features)
    return fit_unknown.Evidence(features, bank, Outputs(foreign_logits, foreign_features), {"noise": 16})


def test_auto_keeps_the_score_that_answers_the_most_foreign_images_unknown() -> None:
    rng = np.random.default_rng(0)
    labels = torch.from_numpy(rng.integers(0, 3, 300))
    logits = torch.from_numpy(rng.normal(size=(300, 3)).astype(np.float32))
    logits[torch.arange(300), labels] += 4.0
    centres = rng.normal(size=(3, 16)) * 5
    images = rng.integers(0, 256, (316, 3, 16, 16), dtype=np.uint8)  # all alike to their statistics
    features = feature_bank.descriptors(centres[labels.numpy()] + rng.normal(size=(300, 16)), images[:300])
    # foreign images: confident logits (the softmax is fooled), features far from every class
    foreign_logits = np.tile([[9.0, 0.0, 0.0]], (16, 1)).astype(np.float32)
    foreign_features = feature_bank.descriptors(rng.normal(size=(16, 16)) * 5, images[300:])
    result = fit_calibration.calibrate(
        logits,
        labels,
        1.0,
        fit_unknown.Request(0.95, "auto", evidence(foreign_logits, foreign_features, features)),
    )
    figures = result["unknown_scores"]
    assert result["unknown_score"] == "knn"
    assert figures["knn"]["foreign_unknown"] == 1.0 and figures["max_probability"]["foreign_unknown"] == 0.0
    assert result["unknown_choice"].startswith("knn: at the threshold accepting 95% of the validation images")
    assert "knn 100%" in result["unknown_choice"] and "max_probability 0%" in result["unknown_choice"]
    assert figures["knn"]["validation_unknown"] == pytest.approx(0.05, abs=0.01)
    assert result["unknown_threshold"] == pytest.approx(figures["knn"]["threshold"])
    # asked for, a score is kept whatever the measurements say
    forced = fit_calibration.calibrate(
        logits,
        labels,
        1.0,
        fit_unknown.Request(0.95, "energy", evidence(foreign_logits, foreign_features, features)),
    )
    assert forced["unknown_score"] == "energy" and "asked for" in forced["unknown_choice"]


def test_knn_asked_for_without_features_is_one_error() -> None:
    logits, labels = torch.randn(50, 3), torch.randint(0, 3, (50,))
    none = fit_unknown.Evidence(why_no_bank="the network's classification layer is not a Linear")
    with pytest.raises(
        UserError, match=r"--unknown_score=knn needs the network's features .* is not a Linear"
    ):
        fit_calibration.calibrate(logits, labels, 1.0, fit_unknown.Request(0.95, "knn", none))


def test_a_knn_calibration_answers_from_logits_and_features() -> None:
    rng = np.random.default_rng(0)
    rows = descriptor_rows(rng, 40, features=6)
    bank = FeatureBank.of(rows).standardized(rows)
    rule = Calibration(1.0, "knn", threshold=-3.0, accept=0.95, bank=bank)
    assert rule.needs_features and not Calibration(1.0, "energy", threshold=1.0).needs_features
    stranger = descriptor_rows(rng, 1, features=6)
    stranger[:, :6] = -rows[:, :6].mean(0)  # features unlike every training image's
    stranger[:, 6:] = feature_bank.image_statistics(np.zeros((1, 3, 16, 16), dtype=np.uint8))  # black
    known = rule.known(np.zeros((4, 2)), np.concatenate([rows[:3], stranger]))
    assert known.tolist() == [True, True, True, False]
    assert rule.reason(-3.2) == (
        "knn score -3.2000 is 0.2000 below the threshold -3.0000, which accepts 95% of the validation images"
    )
    with pytest.raises(ValueError, match="needs the model's features"):
        unknown.score(np.zeros((1, 2)), "knn")


def test_a_knn_sidecar_reads_its_bank_beside_it(tmp_path: Path) -> None:
    path, described = written(tmp_path, descriptor_rows(np.random.default_rng(3), 20, features=4))
    meta = {**KNN_SIDECAR, "feature_bank": described}
    (tmp_path / "m.json").write_text(json.dumps(meta))
    rule = Sidecar.load(tmp_path / "m.json").calibration()
    assert rule.bank is not None and rule.bank.dim == 4 + STATISTICS
    path.unlink()
    with pytest.raises(UserError, match=r"Feature bank '.*m\.features\.npy' .* does not exist"):
        Sidecar.load(tmp_path / "m.json").calibration()
    # with rejection off, no bank is read
    assert Sidecar.load(tmp_path / "m.json").calibration(accept=0).threshold is None


def test_energy_and_threshold_rules() -> None:
    logits = np.array([[10.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    energy = unknown.score(logits, "energy", 2.0)
    np.testing.assert_allclose(energy, 2.0 * np.log(np.exp(logits / 2.0).sum(1)))
    table = unknown.quantiles(np.arange(101.0))
    assert unknown.threshold_for(table, 0.95) == pytest.approx(5.0)
    rule = Calibration(2.0, "energy", threshold=float(energy.mean()))
    assert rule.known(logits).tolist() == [True, False]
    off = Calibration.from_sidecar(
        {"temperature": 2.0, "unknown_threshold": 3.0, "unknown_quantiles": table}, 0
    )
    assert off.threshold is None and off.known(logits).all()


def test_the_reason_for_unknown_names_the_score_the_threshold_and_the_share() -> None:
    rule = Calibration(1.0, "energy", threshold=6.0, accept=0.95)
    assert rule.reason(5.32339) == (
        "energy score 5.3234 is 0.6766 below the threshold 6.0000, which accepts 95% of the validation images"
    )
    assert rule.reason(6.0) == "" and rule.reason(10.5) == ""  # answered with a class
    table = unknown.quantiles(np.arange(101.0))
    meta = {"unknown_threshold": 5.0, "unknown_quantiles": table, "unknown_accept": 0.95}
    assert "accepts 95% of" in Calibration.from_sidecar(meta).reason(1.0)
    assert "below the threshold 50.0000, which accepts 50% of" in Calibration.from_sidecar(meta, 0.5).reason(
        1.0
    )
    assert Calibration.from_sidecar(meta, 0).reason(-1e9) == ""  # rejection off
    older = {"unknown_threshold": 5.0}  # an export from before unknown_accept was written
    assert (
        Calibration.from_sidecar(older).reason(1.0)
        == "energy score 1.0000 is 4.0000 below the export's threshold 5.0000"
    )


def rows(path: Path) -> dict[str, dict]:
    with open(path, newline="") as f:
        return {Path(r["file"]).name: r for r in csv.DictReader(f)}


def test_infer_and_serve_say_why_an_image_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_export(tmp_path, "run", seed=0)
    with_unknown_keys(
        model, 5.0, 25.0
    )  # threshold 6.0: the dark image (energy 5.3) is unknown, the red one not
    for name, colour in {"dark": (5, 5, 5), "red": (220, 30, 20)}.items():
        Image.new("RGB", (20, 20), colour).save(tmp_path / f"{name}.png")
    why = (
        "energy score 5.3234 is 0.6766 below the threshold 6.0000, which accepts 95% of the validation images"
    )
    images = [str(tmp_path / "dark.png"), str(tmp_path / "red.png")]
    infer_main(["--model", str(model), "--top_k", "2", "--output", str(tmp_path / "out.csv"), *images])
    written = rows(tmp_path / "out.csv")
    assert list(written["dark.png"])[-1] == "reason"
    assert (written["dark.png"]["class_name"], written["dark.png"]["reason"]) == ("unknown", why)
    assert (written["red.png"]["class_name"], written["red.png"]["reason"]) == ("red", "")
    capsys.readouterr()
    infer_main(["--model", str(model), *images])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split("\t")[1] == f"unknown ({why})" and "unknown" not in printed[1]
    # room: serve begin
    loaded = load_model(model)
    for name, reason in [("dark", why), ("red", None)]:
        array = loaded.classifier.preprocess(tmp_path / f"{name}.png")
        served = answer(loaded, run_batch([Prepared(loaded, array, 20, 20, None)])[0][0], 2, 1)
        assert served["unknown"]["accept"] == 0.95 and served["unknown"]["threshold"] == pytest.approx(6.0)
        assert served["unknown"]["reason"] == reason, name
    # room: serve end
