"""Experiment trackers beside TensorBoard: the presets for MLflow (read back from a real `mlflow server`),
W&B (offline, read back from its run folder) and CSV; flat parameters; no credential written anywhere."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonargparse import Namespace

from project.terminal import without_credentials
from project.trackers import flat_params
from tests.helpers import fast_args, run_cli

SRC = str(Path(__file__).resolve().parents[1] / "src")  # the code under test, also where it is not installed
SECRET = "s3cr3t-pass"  # the password of the tracking URI: found nowhere after the run


def test_the_configuration_is_flat_readable_and_without_credentials() -> None:
    config = Namespace(
        model=Namespace(
            backbone="resnet18",
            optimizer=Namespace(
                class_path="torch.optim.AdamW", init_args=Namespace(lr=0.002, betas=(0.9, 0.99))
            ),
        ),
        data=Namespace(root=None, scale=[0.7, 1.0]),
        sweep=Namespace(storage=f"postgresql://me:{SECRET}@db.example.org/studies"),
        trackers=[Namespace(class_path="lightning.pytorch.loggers.MLFlowLogger", init_args=Namespace())],
    )
    assert flat_params(config) == {
        "model.backbone": "resnet18",
        "model.optimizer": "torch.optim.AdamW",
        "model.optimizer.lr": 0.002,
        "model.optimizer.betas": "[0.9, 0.99]",
        "data.root": None,
        "data.scale": "[0.7, 1.0]",
        "sweep.storage": "postgresql://db.example.org/studies",
    }
    assert without_credentials(f"see http://u:{SECRET}@host:5000/#/x and https://host/y") == (
        "see http://host:5000/#/x and https://host/y"
    )


def test_a_tracker_whose_package_is_missing_is_one_line_naming_the_extra(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what an environment without mlflow has
    assert run_cli("fit", "--config", "configs/presets/mlflow.yaml", "--trainer.max_epochs=1") == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: The tracker MLFlowLogger (trackers: in the config) needs the `mlflow` package, which is not "
        "installed. Fix: pip install -e '.[trackers]' (or pip install mlflow)."
    ]
    assert not (workdir / "logs").exists() or not any((workdir / "logs").iterdir())


def test_the_printed_config_of_the_mlflow_preset_holds_no_password(workdir: Path) -> None:
    # a process of its own: Lightning reads MLFLOW_TRACKING_URI into a default when it is imported
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://tracker:{SECRET}@127.0.0.1:5000", "PYTHONPATH": SRC}
    preset = ["--config", "configs/presets/mlflow.yaml"]
    command = [sys.executable, "-m", "project", "fit", *preset, "--print_config"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert "class_path: lightning.pytorch.loggers.MLFlowLogger" in done.stdout, done.stderr
    assert SECRET not in done.stdout + done.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`mlflow server` on 127.0.0.1 (SQLite backend, a local artifact folder): its URL and its folder."""
    pytest.importorskip("mlflow", reason="mlflow (the `trackers` extra, in .[dev]) is not installed")
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [
        str(Path(sys.executable).with_name("mlflow")),
        *("server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}"),
        *("--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1"),
        *("--port", str(port), "--workers", "1"),
    ]
    log = folder / "server.log"
    with log.open("wb") as output:  # its own session: stopping it stops its uvicorn worker too
        server = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # its job runner starts seven worker processes that the tracking API does not need
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url, server, log)
        yield url, folder
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def wait_for(url: str, server: subprocess.Popen, log: Path, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited ({server.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"mlflow server did not answer within {seconds} s: {log.read_text()[-2000:]}")


def tensorboard_points(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, round(event.value, 6)) for event in events.Scalars(tag)]


def artifact_files(client: Any, run_id: str, path: str | None = None) -> dict[str, int]:
    """{artifact path: size} of a run, folders walked."""
    found = {}
    for artifact in client.list_artifacts(run_id, path):
        if artifact.is_dir:
            found.update(artifact_files(client, run_id, artifact.path))
        else:
            found[artifact.path] = artifact.file_size
    return found


@pytest.mark.slow
def test_a_fit_with_the_mlflow_preset_is_on_the_server_with_its_params_curve_and_files(
    mlflow_server: tuple[str, Path],
    shapes_root: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from mlflow import MlflowClient

    url, server_folder = mlflow_server
    host = url.removeprefix("http://")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://tracker:{SECRET}@{host}")  # MLflow's own variables
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "shapes")
    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "false")  # MLflow would print the password
    extra = ["--trainer.max_epochs=2", "--export_best.enabled=true"]
    # the export, not its calibration, is what is sent  # room: calibration
    extra.append("--export_best.calibrate=false")  # room: calibration
    args = fast_args(shapes_root, *extra, "--name=tracked")
    assert run_cli("fit", "--config", "configs/presets/mlflow.yaml", *args) == 0
    output = capfd.readouterr()

    client = MlflowClient(url)
    (run,) = client.search_runs([client.get_experiment_by_name("shapes").experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    params = run.data.params  # the resolved configuration, flat
    assert params["model.backbone"] == "resnet18"
    assert params["model.optimizer"] == "torch.optim.AdamW"
    assert float(params["model.optimizer.lr"]) == 0.002 and params["trainer.max_epochs"] == "2"
    assert params["data.image_size"] == "32" and params["checkpoint.monitor"] == "val/acc"
    assert not [key for key in params if "init_args" in key or key.startswith("_") or "/" in key]

    # one point per epoch, under TensorBoard's name and at its steps; TensorBoard has its curve as before
    history = [(m.step, round(m.value, 6)) for m in client.get_metric_history(run.info.run_id, "val/acc")]
    assert history == tensorboard_points(workdir / "logs" / "tracked", "val/acc") and len(history) == 2

    checkpoints = workdir / "checkpoints" / "tracked"
    best = run.data.tags["best_checkpoint"]
    assert (checkpoints / best).is_file() and f"val_acc={run.data.metrics['best/val/acc']:.4f}" in best
    (onnx,) = (path for path in checkpoints.glob("tracked-*.onnx"))
    files = artifact_files(client, run.info.run_id)
    assert files[f"export/{onnx.name}"] == onnx.stat().st_size
    assert files[f"export/{onnx.stem}.json"] == onnx.with_suffix(".json").stat().st_size
    assert {"data_check/class_counts.txt", "data_check/first_batch.txt"} <= set(files)
    assert "report/report.png" in files  # room: report
    counts = client.download_artifacts(run.info.run_id, "data_check/class_counts.txt", str(workdir))
    assert "triangle" in Path(counts).read_text()

    # the run's address is printed without the password; no file of the run or of the server holds it
    assert f"mlflow:       {url}/#/experiments/" in output.out
    assert SECRET not in output.out + output.err
    files_with_it = [
        path
        for folder in (workdir, server_folder)
        for path in folder.rglob("*")
        if path.is_file() and SECRET.encode() in path.read_bytes()
    ]
    assert files_with_it == []


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of an offline W&B run file (`run-<id>.wandb`: a LevelDB-style log of protobufs)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    position, record = 7, b""
    while position + 7 <= len(data):
        left = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if left < 7 or (kind == 0 and length == 0):  # the rest of a block is padding
            position += left
            continue
        if position + 7 + length > len(data):
            return  # the tail W&B is still writing
        record += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last part of one
            parsed = wandb_internal_pb2.Record()
            parsed.ParseFromString(record)
            record = b""
            yield parsed


def finished_records(folder: Path, seconds: float = 60) -> list[Any]:
    """The records of the one offline run under `folder`, once W&B has written its `exit` record: its
    service process writes the file after the run finishes in this one."""
    deadline = time.monotonic() + seconds
    while True:
        paths = list(folder.glob("offline-run-*/run-*.wandb"))
        records = list(wandb_records(paths[0])) if len(paths) == 1 else []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def entries(items: Iterable[Any]) -> dict[str, Any]:
    """{key: value} of a W&B record's items (a key with '/' is stored as its parts)."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


@pytest.mark.slow
def test_a_fit_with_the_wandb_preset_offline_keeps_its_params_curve_and_files_in_the_run_folder(
    shapes_root: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb", reason="wandb (the `trackers` extra, in .[dev]) is not installed")
    for key, value in {"WANDB_MODE": "offline", "WANDB_PROJECT": "shapes", "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(key, value)  # W&B's own variables: nothing leaves the machine
    monkeypatch.delenv("WANDB_DIR", raising=False)
    # the CSV preset's logger too, added on the command line: metrics.csv beside
    csv_logger = ["--trackers+=lightning.pytorch.loggers.CSVLogger", "--trackers.save_dir=logs"]
    args = fast_args(shapes_root, "--trainer.max_epochs=2", "--name=offline")
    try:
        assert run_cli("fit", "--config", "configs/presets/wandb.yaml", *csv_logger, *args) == 0
    finally:
        wandb.finish()  # a command's process ends its W&B run when it exits; this one goes on

    records = finished_records(workdir / "logs" / "wandb")
    (folder,) = (workdir / "logs" / "wandb").glob("offline-run-*")
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "offline" and run.project == "shapes"
    config = entries(i for r in records if r.HasField("config") for i in r.config.update)
    assert config["model.backbone"] == "resnet18" and config["trainer.max_epochs"] == 2
    assert config["model.optimizer.lr"] == 0.002 and "backbone" not in config
    history = [entries(r.history.item) for r in records if r.HasField("history")]
    points = [(h["trainer/global_step"], round(h["val/acc"], 6)) for h in history if "val/acc" in h]
    assert points == tensorboard_points(workdir / "logs" / "offline", "val/acc") and len(points) == 2
    summary = entries(i for r in records if r.HasField("summary") for i in r.summary.update)
    assert (workdir / "checkpoints" / "offline" / summary["best_checkpoint"]).is_file()
    assert f"val_acc={summary['best/val/acc']:.4f}" in summary["best_checkpoint"]
    assert "triangle" in (folder / "files" / "data_check" / "class_counts.txt").read_text()
    assert (folder / "files" / "report" / "report.png").stat().st_size > 0  # room: report

    with (workdir / "logs" / "offline" / "csv" / "metrics.csv").open() as rows:
        accuracy = [float(row["val/acc"]) for row in csv.DictReader(rows) if row["val/acc"]]
    assert [round(a, 6) for a in accuracy] == [value for _, value in points]
