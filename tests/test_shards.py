"""Shards (data/shards.py, optimize.py): made from image folders, trained from, resumed mid-epoch, read by
several processes, and from an S3-compatible server on 127.0.0.1 (moto) like from a bucket."""

from __future__ import annotations

import json
import multiprocessing
import socket
import tempfile  # room: audit
import time
from pathlib import Path

import pytest
import torch

# room: audit begin
from project.audit.command import main as audit

# room: audit end
from project.data.datamodule import ImageDataModule
from project.data.transforms import eval_transform
from project.errors import UserError
from project.optimize import main as optimize
from tests.helpers import exit_status, fast_args, run_cli, workers_blocking_stop_signals

litdata = pytest.importorskip("litdata")

from project.data.streaming import ShardSource  # noqa: E402


@pytest.fixture(scope="module")
def shards(shapes_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shapes (6 classes, 48 train + 24 val JPEGs) as shards, 2 processes."""
    out = tmp_path_factory.mktemp("shards") / "out"
    before = multiprocessing.get_start_method(allow_none=True)
    assert exit_status(optimize, f"--data.root={shapes_root}", f"--output={out}", "--workers=2") == 0
    # LitData sets "spawn" process-wide; a later process pool in this process lost its globals
    assert multiprocessing.get_start_method(allow_none=True) == before
    return out


def dataset(root: str | Path, split: str, shuffle: bool = True, seed: int = 1) -> object:
    """A split of the shards at `root` whose samples also carry their id (position in the split)."""
    data = ShardSource(str(root)).dataset(split, eval_transform(32), shuffle, seed, skip_bad_images=False)
    data.with_ids = True
    return data


def ids(root: str | Path, split: str, **loader: object) -> list[int]:
    batches = litdata.StreamingDataLoader(dataset(root, split), batch_size=5, **loader)
    return [i for batch in batches for i in batch[2].tolist()]


def test_optimize_writes_every_image_with_the_class_counts(shards: Path, shapes_root: Path) -> None:
    index = json.loads((shards / "shards.json").read_text())
    assert index["task"] == "multiclass"
    assert len(index["class_names"]) == 6
    assert index["splits"]["train"]["count"] == 48 and index["splits"]["val"]["count"] == 24
    assert set(index["splits"]["train"]["class_counts"].values()) == {8}
    assert sorted(ids(shards, "train")) == list(range(48))
    # the bytes as they are: the first file of the split is stored unchanged
    data = litdata.StreamingDataset(str(shards / "val"))
    first = sorted((shapes_root / "val").rglob("*.jpg"))[0].read_bytes()
    assert any(data[i]["image"] == first for i in range(len(data)))


def test_second_optimize_on_the_same_output_is_refused(
    shards: Path, shapes_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.name for p in shards.rglob("*"))
    assert exit_status(optimize, f"--data.root={shapes_root}", f"--output={shards}") == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "Fix:" in err
    assert sorted(p.name for p in shards.rglob("*")) == before


def test_max_side_stores_images_downscaled(flat_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "small"
    args = [f"--data.root={flat_root}", "--data.val_split=0.25", f"--output={out}", "--max_side=16"]
    assert exit_status(optimize, *args, "--workers=1") == 0
    index = json.loads((out / "shards.json").read_text())
    assert index["splits"]["train"]["count"] + index["splits"]["val"]["count"] == 48
    image = ShardSource(str(out)).dataset("val", lambda x: x, False, 0, skip_bad_images=False)[0][0]
    assert max(image.shape[1:]) == 16


@pytest.mark.slow
def test_fit_and_validate_read_the_shards_and_the_fit_ends_with_a_verified_export(
    shards: Path, workdir: Path
) -> None:
    assert run_cli("fit", *fast_args(shards, "--export_best.enabled=true")) == 0
    ckpt = next((workdir / "checkpoints").rglob("epoch=*.ckpt"))
    assert torch.load(ckpt, weights_only=False)["hyper_parameters"]  # a checkpoint like from folders
    assert_verified_export(ckpt.parent)
    assert run_cli("validate", *fast_args(shards)[:2], f"--ckpt_path={ckpt}") == 0


def assert_verified_export(folder: Path) -> None:
    """The export beside the checkpoints passed verification on real images and read its data."""
    sidecar = json.loads((folder / "latest.json").read_text())
    assert sidecar["verification"]["passed"] and (folder / "latest.onnx").is_file()
    text = json.dumps(sidecar)
    assert "holds shards" not in text and "not on this machine" not in text and "s3:/d" not in text


def test_the_export_reads_its_images_from_the_shards(shards: Path) -> None:
    from project.export import validation_images
    from project.export.validation import validation_loader

    data = ImageDataModule(root=str(shards), image_size=32, num_workers=0)
    images = validation_images(data)
    assert len(images) == 7 and all(i.dtype == torch.uint8 and i.shape == (3, 32, 32) for i in images)
    assert sum(len(labels) for _, labels in validation_loader(data, 32, 0.875)) == 24
    # room: int8 begin
    from project.export.quantize import TrainingImages

    calibration = TrainingImages(data, 32, 0.875)
    assert sum(len(batch["images"]) for batch in iter(calibration.get_next, None)) == 48
    # room: int8 end


# room: audit begin
@pytest.mark.slow
def test_audit_reads_the_images_of_the_shards_as_of_their_folder(
    shards: Path, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this audit's temp folder, not another test's
    tiny = [*fast_args(shards)[1:5], "--folds=2", "--epochs=1", "--trainer.enable_progress_bar=false"]
    assert exit_status(audit, f"--data.root={shards}", *tiny, "--name=shards") == 0
    rows = (workdir / "logs" / "shards" / "audit" / "oof_probabilities.csv").read_text().splitlines()[1:]
    assert len(rows) == 72  # every image of every split, as from the folder (48 train + 24 val)
    assert {row.split(",")[0].split("/")[0] for row in rows} == {"train", "val"}
    assert not list(tmp_path.glob("audit-shards-*"))  # the images' copy is gone


# room: audit end
@pytest.mark.slow
def test_loader_resumes_mid_epoch_with_the_samples_not_yet_seen(shards: Path) -> None:
    data = dataset(shards, "train", seed=3)
    loader = litdata.StreamingDataLoader(data, batch_size=4, num_workers=2)
    seen: list[int] = []
    for step, batch in enumerate(loader):
        seen += batch[2].tolist()
        if step == 4:
            state = loader.state_dict()
            break
    again = dataset(shards, "train", seed=3)
    resumed = litdata.StreamingDataLoader(again, batch_size=4, num_workers=2)
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in batch[2].tolist()]
    assert len(seen) == 20 and len(rest) == 28
    assert sorted(seen + rest) == list(range(48))  # one epoch, no repeats


def test_the_shards_loader_workers_leave_stop_signals_to_the_main_process(shards: Path) -> None:
    dm = ImageDataModule(root=str(shards), image_size=24, batch_size=5, num_workers=2)
    dm.setup("fit")
    assert workers_blocking_stop_signals(dm.val_dataloader()) == [True, True]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server() -> str:
    """moto's S3-compatible server on 127.0.0.1, reached over HTTP like AWS, GCS or MinIO."""
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    yield f"http://127.0.0.1:{server._port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The usual variables, as a user sets them for a bucket: endpoint, credentials, region."""
    for key, value in {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # a local server speaks plain HTTP: LitData's uploads (obstore) refuse it unless allowed
        "AWS_ALLOW_HTTP": "true",
    }.items():
        monkeypatch.setenv(key, value)
    return s3_server


@pytest.mark.slow
def test_optimize_to_a_bucket_fit_and_read_it_back(
    s3_env: str, shapes_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from project.data.shards import read_index, s3_client

    # LitData stages chunks for the upload in /tmp/chunks, shared by every run on the machine
    monkeypatch.setenv("DATA_OPTIMIZER_CACHE_FOLDER", str(tmp_path / "staged"))
    monkeypatch.setenv("DATA_OPTIMIZER_DATA_CACHE_FOLDER", str(tmp_path / "staged-data"))
    s3_client().create_bucket(Bucket="data")
    assert (
        exit_status(optimize, f"--data.root={shapes_root}", "--output=s3://data/shapes", "--workers=1") == 0
    )
    assert read_index("s3://data/shapes").splits["val"].count == 24
    assert sorted(ids("s3://data/shapes", "val")) == list(range(24))
    monkeypatch.setenv("LITDATA_CACHE_DIR", str(tmp_path / "chunks"))  # not ~/.lightning/chunks
    monkeypatch.chdir(tmp_path)
    assert run_cli("fit", *fast_args("s3://data/shapes", "--export_best.enabled=true")) == 0  # type: ignore[arg-type]
    assert_verified_export(next((tmp_path / "checkpoints").rglob("last.ckpt")).parent)


@pytest.mark.slow
def test_chunk_names_in_a_bucket_that_climb_out_are_refused_and_nothing_is_written_outside(
    s3_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from project.data.shards import s3_client
    from tests.shard_files import edit_json, write_shards

    local = write_shards(tmp_path / "made")
    climbing = "../../../outside/chunk-0-0.bin"
    edit_json(local / "train" / "index.json", lambda index: index["chunks"][0].update(filename=climbing))
    client = s3_client()
    client.create_bucket(Bucket="crafted")
    for path in local.rglob("*"):
        if path.is_file():
            client.put_object(Bucket="crafted", Key=f"set/{path.relative_to(local)}", Body=path.read_bytes())
    client.put_object(Bucket="crafted", Key=f"set/train/{climbing}", Body=b"x")  # S3 keys may hold '..'
    cache = tmp_path / "deep" / "er" / "cache"
    monkeypatch.setenv("LITDATA_CACHE_DIR", str(cache))
    before = set(tmp_path.rglob("*"))
    with pytest.raises(UserError, match=r"expected a plain name such as 'chunk-0-0\.bin'"):
        ShardSource("s3://crafted/set").dataset("train", lambda image: image, True, 0, False)
    assert {p for p in set(tmp_path.rglob("*")) - before if cache not in p.parents} == set()


def test_unreachable_bucket_is_one_error_line_within_seconds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    start = time.monotonic()
    assert run_cli("fit", "--data.root=s3://nowhere/shards") == 2
    assert time.monotonic() - start < 20
    err = capsys.readouterr().err
    assert "error: Cannot read 's3://nowhere/shards/shards.json'" in err
