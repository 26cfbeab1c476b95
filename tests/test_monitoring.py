"""What TensorBoard shows of a run, checked through a real `tensorboard` server's HTTP data API."""

from __future__ import annotations

import contextlib
import io
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np  # room: pictures
import pytest
import torch  # room: pictures
from PIL import Image  # room: pictures
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util  # room: pictures

# room: pictures begin
from project.data.shapes import CLASSES

# room: pictures end
from tests.helpers import fast_args, run_cli

pytestmark = pytest.mark.slow  # every test here trains or starts a server

RUN = "monitored"


class Terminal(io.StringIO):
    """Captured output that says it is a terminal: fit shows its progress bar there (a file gets lines)."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory, shapes_root: Path) -> tuple[Path, str]:
    """A 2-epoch fit with the progress bar on (as on a terminal): the work folder and what the bar printed."""
    work = tmp_path_factory.mktemp("work")
    stdout = Terminal()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(stdout):
        patch.chdir(work)
        args = fast_args(shapes_root, f"--name={RUN}", "--trainer.max_epochs=2")
        assert run_cli("fit", *args, "--trainer.enable_progress_bar=true") == 0
    return work, stdout.getvalue()


class TensorBoard:
    """A `tensorboard` subprocess on 127.0.0.1 and a free port, queried through its HTTP data API."""

    def __init__(self, logdir: Path, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "tensorboard.main", f"--logdir={logdir}", "--host=127.0.0.1"),
                *(f"--port={self.port}", "--load_fast=false", "--reload_interval=0"),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def get(self, route: str, **query: str | int) -> bytes:
        url = f"http://127.0.0.1:{self.port}/data/{route}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read()

    def json(self, route: str, **query: str | int) -> dict | list:
        return json.loads(self.get(route, **query))

    def post(self, route: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/data/{route}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "X-XSRF-Protected": "1"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def wait_for(self, run: str, timeout: float = 60) -> None:
        """Until the server answers and has loaded what the run logged."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "tensorboard exited"
            with contextlib.suppress(OSError):
                loaded = "val/acc" in self.json("plugin/scalars/tags").get(run, {})
                loaded = loaded and bool(self.json("plugin/images/tags").get(run))  # room: pictures
                if loaded:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"tensorboard did not serve run {run} in {timeout} s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture(scope="module")
def tensorboard(fitted: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TensorBoard]:
    work, _ = fitted
    server = TensorBoard(work / "logs", tmp_path_factory.mktemp("tb") / "tensorboard.log")
    try:
        server.wait_for(RUN)
        yield server
    finally:
        server.stop()
    assert server.process.returncode is not None


def scalars(server: TensorBoard, tag: str) -> tuple[list[int], list[float]]:
    """(steps, values) of a scalar tag, from the server."""
    points = server.json("plugin/scalars/scalars", run=RUN, tag=tag)
    return [int(p[1]) for p in points], [float(p[2]) for p in points]


def best_checkpoint_score(work: Path) -> float:
    names = [p.name for p in (work / "checkpoints" / RUN).glob("epoch=*.ckpt")]
    return max(float(re.search(r"val_acc=(\d\.\d{4})", n).group(1)) for n in names)


def test_scalars_match_the_run(fitted: tuple[Path, str], tensorboard: TensorBoard) -> None:
    work, _ = fitted
    tags = set(tensorboard.json("plugin/scalars/tags")[RUN])
    run_level = {"train/loss", "val/acc", "val/acc_best"}
    run_level |= {"train/images_per_sec", "time/epoch_s"}  # room: dashboard
    assert run_level <= tags

    steps, acc = scalars(tensorboard, "val/acc")
    assert steps == [2, 5]  # 3 batches per epoch; Lightning logs epoch metrics at the epoch's last step
    assert max(acc) == pytest.approx(best_checkpoint_score(work), abs=5e-5)
    assert scalars(tensorboard, "val/acc_best")[1][-1] == pytest.approx(max(acc))
    # room: pictures begin
    per_class = {f"val_class_acc/{c}" for c in CLASSES}
    assert per_class <= tags
    # 4 validation images per class: the mean of the per-class accuracies is the accuracy
    class_acc = np.array([scalars(tensorboard, tag)[1] for tag in sorted(per_class)])
    assert class_acc.mean(axis=0) == pytest.approx(acc, abs=1e-6)
    # room: pictures end

    # room: dashboard begin
    _, epoch_s = scalars(tensorboard, "time/epoch_s")
    assert len(epoch_s) == 2 and all(0 < s < 60 for s in epoch_s)
    assert all(0 < rate < 1e5 for rate in scalars(tensorboard, "train/images_per_sec")[1])
    # room: dashboard end


# room: pictures begin
def test_images_are_real_pictures_at_the_metric_steps(tensorboard: TensorBoard) -> None:
    tags = tensorboard.json("plugin/images/tags")[RUN]
    assert set(tags) == {"train/images", "val/confusion_matrix", "val/misclassified"}
    steps = {}
    for tag in tags:
        samples = tensorboard.json("plugin/images/images", run=RUN, tag=tag, sample=0)
        steps[tag] = [s["step"] for s in samples]
        png = tensorboard.get(f"plugin/images/individualImage?{samples[-1]['query']}")
        image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        assert image.shape[0] > 200 and image.shape[1] > 300, (tag, image.shape)
        assert len(np.unique(image.reshape(-1, 3), axis=0)) > 100, tag  # a drawing, not a blank image
    assert steps["train/images"] == [0]
    assert steps["val/confusion_matrix"] == steps["val/misclassified"] == [2, 5]  # like val/acc


# room: pictures end
# room: dashboard begin
def test_hparams_view_shows_the_final_metrics(tensorboard: TensorBoard) -> None:
    experiment = tensorboard.post("plugin/hparams/experiment", {"experimentName": ""})
    hparams = {h["name"] for h in experiment["hparamInfos"]}
    assert {"backbone", "optimizer/init_args/lr", "batch_size", "trainer/max_epochs"} <= hparams
    metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
    assert {"val/acc", "val/acc_best", "val/loss", "train/loss", "time/epoch_s"} <= metrics
    assert not any(m.startswith(("val_class_acc/", "lr-", "epoch")) for m in metrics)

    groups = tensorboard.post(
        "plugin/hparams/session_groups",
        {"experimentName": "", "startIndex": 0, "sliceSize": 10, "allowedStatuses": ["STATUS_SUCCESS"]},
    )["sessionGroups"]
    assert [g["name"] for g in groups] == [RUN]
    assert groups[0]["hparams"]["backbone"] == "resnet18"
    assert groups[0]["hparams"]["optimizer/init_args/lr"] == pytest.approx(0.002)
    values = {m["name"]["tag"]: m["value"] for m in groups[0]["metricValues"]}
    for tag in ("val/acc", "val/acc_best", "val/loss"):
        assert values[tag] == pytest.approx(scalars(tensorboard, tag)[1][-1]), tag


# room: dashboard end


# room: pictures begin
def test_confusion_matrix_counts_agree_with_accuracy(fitted: tuple[Path, str]) -> None:
    work, _ = fitted
    events = EventAccumulator(str(work / "logs" / RUN), size_guidance={"tensors": 0})
    events.Reload()
    counts = [tensor_util.make_ndarray(e.tensor_proto) for e in events.Tensors("val/confusion_matrix_counts")]
    accuracy = [s.value for s in events.Scalars("val/acc")]
    assert len(counts) == len(accuracy) == 2
    assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")  # room: dashboard
    for matrix, acc in zip(counts, accuracy, strict=True):
        assert matrix.shape == (6, 6) and (matrix.sum(axis=1) == 4).all()  # rows: the true classes
        assert np.trace(matrix) / matrix.sum() == pytest.approx(acc, abs=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_monitoring_on_gpu(workdir: Path, shapes_root: Path) -> None:
    assert run_cli("fit", *fast_args(shapes_root, "--name=g", "--trainer.accelerator=gpu")) == 0
    events = EventAccumulator(str(workdir / "logs" / "g"), size_guidance={"tensors": 0})
    events.Reload()
    assert set(events.Tags()["images"]) == {"train/images", "val/confusion_matrix", "val/misclassified"}
    counts = tensor_util.make_ndarray(events.Tensors("val/confusion_matrix_counts")[-1].tensor_proto)
    assert counts.sum() == 24


# room: pictures end
# room: dashboard begin
def test_progress_bar_shows_throughput_and_time_left(fitted: tuple[Path, str]) -> None:
    _, printed = fitted
    assert re.search(r"img/s=\d+\.\d", printed), printed[-2000:]
    assert re.search(r"eta_s=\d+\.\d", printed)
    assert re.search(r"\d\d:\d\d<\d\d:\d\d", printed)  # tqdm's own elapsed<remaining for the epoch


# room: dashboard end


def test_monitoring_switches_off(workdir: Path, shapes_root: Path) -> None:
    off: list[str] = []
    off += ["--throughput.enabled=false", "--hparams.enabled=false"]  # room: dashboard
    pictures = ("training_images", "confusion_matrix", "misclassified")  # room: pictures
    off += [f"--{key}.enabled=false" for key in pictures]  # room: pictures
    assert run_cli("fit", *fast_args(shapes_root, "--name=quiet", *off)) == 0
    events = EventAccumulator(str(workdir / "logs" / "quiet"))
    events.Reload()
    tags = events.Tags()
    assert tags["images"] == []
    assert "val/confusion_matrix_counts" not in tags["tensors"]  # room: pictures
    with pytest.raises(KeyError):  # no hparams summaries
        events.PluginTagToContent("hparams")
    assert "val/acc" in tags["scalars"]
    assert not [t for t in tags["scalars"] if t.startswith(("val_class_acc/", "time/", "train/images"))]
