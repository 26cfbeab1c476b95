"""`python -m project report RUN`: one PNG and an HTML page from a run's event files."""

from __future__ import annotations

import html
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from project.data.shapes import CLASSES
from project.report import main, read_run
from tests.helpers import CHROMIUM, FLAGS, fast_args, run_cli

REPORT_SCREENSHOT = Path(__file__).parents[1] / "docs" / "images" / "report-page.png"

SRC = Path(__file__).resolve().parents[1] / "src"


def report(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m project report ARGS` in a fresh process, as a user runs it (without torch or Lightning)."""
    code = (
        "import sys, runpy; runpy.run_module('project', run_name='__main__'); "
        "assert not {'torch', 'lightning'} & set(sys.modules), 'report imported torch or lightning'"
    )
    return subprocess.run(
        [sys.executable, "-c", code, "report", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


@pytest.mark.slow
def test_report_draws_the_run(workdir: Path, shapes_root: Path) -> None:
    assert run_cli("fit", *fast_args(shapes_root, "--name=seen")) == 0
    result = report("seen", cwd=workdir)
    assert result.returncode == 0, result.stderr
    png, page = workdir / "logs" / "seen" / "report.png", workdir / "logs" / "seen" / "report.html"
    assert png.stat().st_size > 50_000
    image = np.asarray(Image.open(png).convert("RGB"))
    assert image.shape == (1100, 2000, 3)
    colours = np.unique(image.reshape(-1, 3), axis=0)
    assert len(colours) > 500  # curves, text, a colour map: not a blank or flat image
    white = (image == 255).all(axis=2).mean()
    assert 0.3 < white < 0.97, white  # mostly background, but with a lot drawn on it
    # the confusion-matrix panel (bottom left) is drawn in the colour map's blues, not left empty
    bottom_left = image[500:, :1000].reshape(-1, 3).astype(int)
    blues = (bottom_left[:, 2] > bottom_left[:, 0] + 40).mean()
    assert blues > 0.05, blues
    text = page.read_text()
    assert '<img src="report.png"' in text and "val/acc" in text and "val_class_acc/star" in text

    run = read_run(workdir / "logs" / "seen")  # what was drawn: the run's own numbers
    assert run.class_names == list(CLASSES)
    assert run.counts is not None and run.counts.sum() == 24
    assert np.trace(run.counts) / 24 == pytest.approx(run.last("val/acc"), abs=1e-6)

    other = workdir / "elsewhere" / "r.png"  # a run folder's path works too, and --output
    main([str(workdir / "logs" / "seen"), f"--output={other}"])
    assert other.stat().st_size > 50_000 and other.with_suffix(".html").is_file()


def test_report_errors_are_one_line(workdir: Path, capsys) -> None:
    (workdir / "logs" / "empty").mkdir(parents=True)
    for run, message in (
        (
            "missing",
            "error: Run 'missing' not found: no folder 'logs/missing' or 'missing'. Runs in logs/: empty",
        ),
        ("empty", "error: 'logs/empty' has no TensorBoard event files"),
    ):
        with pytest.raises(SystemExit) as exit:
            main([run])
        assert exit.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and "Fix: " in err and err.count("\n") == 1, err
    assert not (workdir / "logs" / "empty" / "report.png").exists()


@pytest.mark.slow
def test_a_class_named_like_mathtext_is_trained_and_reported(workdir: Path, shapes_root: Path) -> None:
    data = workdir / "data"
    for split in ("train", "val"):
        for name, source in ((r"$\undefinedcmd$", "circle"), ("$x^2$", "square")):
            shutil.copytree(shapes_root / split / source, data / split / name)
    assert run_cli("fit", *fast_args(data, "--name=odd", "--trainer.max_epochs=1")) == 0
    result = report("odd", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert (workdir / "logs" / "odd" / "report.png").stat().st_size > 50_000


def test_a_declared_confusion_matrix_shape_is_bounded_before_allocating(
    workdir: Path, capsys: pytest.CaptureFixture
) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    run = workdir / "logs" / "crafted"
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=50_000)] * 2)
    counts = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64, tensor_shape=shape, int64_val=[1])
    writer = EventFileWriter(str(run))  # one value, repeated to fill [50000, 50000]: 18.6 GiB
    for summary in (
        summary_pb2.Summary.Value(tag="val/acc", simple_value=0.5),
        summary_pb2.Summary.Value(tag="val/confusion_matrix_counts", tensor=counts),
    ):
        writer.add_event(event_pb2.Event(step=3, summary=summary_pb2.Summary(value=[summary])))
    writer.close()
    with pytest.raises(SystemExit) as exit:
        main(["crafted"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: 'logs/crafted': the event files' val/confusion_matrix_counts at step 3 has the shape "
        "[50000, 50000]; expected [C, C] for C from 1 to 200 classes, as fit logs it. Fix: "
    )
    assert err.count("\n") == 1


HTML_NAME = "<img src=x onerror=alert(1)>"  # a class name that is markup


def crafted_run(workdir: Path) -> Path:
    """logs/page as fit writes it (scalars, per-class accuracy, the misclassified grid) and its export's
    sidecar: written directly, in milliseconds instead of a fit.

    The sidecar has a reliability table.  # room: calibration
    """
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    grid = np.zeros((40, 80, 3), dtype=np.uint8)
    grid[:, :40] = (200, 40, 40)  # two tiles: red, then blue
    grid[:, 40:] = (40, 40, 200)
    buffer = io.BytesIO()
    Image.fromarray(grid).save(buffer, "PNG")
    picture = summary_pb2.Summary.Image(
        height=40, width=80, colorspace=3, encoded_image_string=buffer.getvalue()
    )
    run = workdir / "logs" / "page"
    writer = EventFileWriter(str(run))
    for step in (5, 10):
        values = [("train/loss", 2.0 / step), ("val/loss", 1.5 / step), ("val/acc", step / 12)]
        values += [("epoch", step // 5 - 1), ("val_class_acc/star", 0.9), (f"val_class_acc/{HTML_NAME}", 0.4)]
        summary = [summary_pb2.Summary.Value(tag=tag, simple_value=value) for tag, value in values]
        summary.append(summary_pb2.Summary.Value(tag="val/misclassified", image=picture))
        writer.add_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=summary)))
    writer.close()
    # room: calibration begin
    bins = {"confidence": [0.1 * i + 0.05 for i in range(10)], "accuracy": [0.1 * i for i in range(10)]}
    reliability = {"bins": 10, "before": {**bins, "count": [3] * 10}, "after": {**bins, "count": [3] * 10}}
    # room: calibration end
    sidecar = {"class_names": ["star", HTML_NAME], "image_size": 8, "preprocessing": {"crop_ratio": 1.0}}
    # room: calibration begin
    sidecar |= {"temperature": 1.5, "ece_before": 0.1, "ece_after": 0.05, "reliability": reliability}
    # room: calibration end
    (workdir / "checkpoints" / "page").mkdir(parents=True)
    (workdir / "checkpoints" / "page" / "latest.json").write_text(json.dumps(sidecar))
    return run


def test_report_html_shows_the_reliability_diagram_and_the_misclassified_images(workdir: Path) -> None:
    run = crafted_run(workdir)
    main(["page"])
    assert np.asarray(Image.open(run / "misclassified.png"))[0, 0].tolist() == [200, 40, 40]  # the grid
    assert Image.open(run / "reliability.png").size == (1000, 480)  # room: calibration
    text = (run / "report.html").read_text()
    pictures = ['<img src="report.png"']
    pictures.append('<img src="reliability.png"')  # room: calibration
    pictures.append('<img src="misclassified.png"')
    for picture in pictures:
        assert picture in text
    assert "<h2>Misclassified validation images at step 10 (true → predicted)</h2>" in text
    assert HTML_NAME not in text and html.escape(HTML_NAME) in text  # a name is text, never markup


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.is_file(), reason=f"no {CHROMIUM}: install Debian's chromium")
def test_report_html_in_a_browser(workdir: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
    run = crafted_run(workdir)
    main(["page"])
    dialogs: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        page = browser.new_page(viewport={"width": 1000, "height": 700})
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto((run / "report.html").as_uri())
        # every picture loaded (an image that fails to load has no natural width)
        sizes = page.eval_on_selector_all("img", "images => images.map(i => [i.src, i.naturalWidth])")
        assert [(Path(src).name, width) for src, width in sizes] == [
            ("report.png", 2000),
            ("reliability.png", 1000),  # room: calibration
            ("misclassified.png", 80),
        ]
        assert (
            "Misclassified validation images at step 10 (true → predicted)"
            in page.locator("h2").all_text_contents()
        )
        # room: calibration begin
        reliability = "Reliability of the export's probabilities (validation split)"
        assert page.locator("h2").all_text_contents()[0] == reliability
        # room: calibration end
        assert f"val_class_acc/{HTML_NAME}" in page.locator("td").all_text_contents()
        page.screenshot(path=str(REPORT_SCREENSHOT), full_page=True)
        browser.close()
    assert dialogs == []


@pytest.mark.slow
def test_a_later_validate_or_predict_leaves_the_fits_curves_as_they_were(
    workdir: Path, shapes_root: Path, tmp_path: Path
) -> None:
    """TensorBoard reads a run folder's event files as one series per tag: an evaluation at step 0 in the
    fit's folder made it drop the fit's later points."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fit = fast_args(shapes_root, "--name=kept", "--trainer.max_epochs=2", "--trainer.limit_train_batches=2")
    assert run_cli("fit", *fit) == 0
    folder = workdir / "logs" / "kept"
    fitted = read_run(folder)
    steps, values = fitted.scalars["val/acc"]
    assert len(steps) == 2 and steps[0] > 0

    ckpt = workdir / "checkpoints" / "kept" / "last.ckpt"
    images = tmp_path / "incoming"
    images.mkdir()
    shutil.copy(next((shapes_root / "val" / "circle").glob("*.jpg")), images / "a.jpg")
    for command in ("validate", "predict"):
        extra = [f"--data.predict_dir={images}"] if command == "predict" else []
        assert run_cli(command, f"--ckpt_path={ckpt}", "--data.num_workers=0", *extra) == 0

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # TensorBoard's reader of a run
    events.Reload()
    points = events.Scalars("val/acc")
    assert [p.step for p in points] == list(steps)
    assert [p.value for p in points] == pytest.approx(values)
    after = read_run(folder)
    assert after.counts_step == fitted.counts_step == steps[-1]
    assert np.array_equal(after.scalars["val/acc"][0], steps)
    result = report("kept", cwd=workdir)
    assert result.returncode == 0, result.stderr
    page = (folder / "report.html").read_text()
    assert f"<td>val/acc</td><td>{values[-1]:.6g}</td><td>{steps[-1]}</td>" in page
    # the evaluation's own numbers are a run of their own beside the fit's
    validated = EventAccumulator(str(folder / "validate"))
    validated.Reload()
    assert [p.value for p in validated.Scalars("val/acc")] == pytest.approx([values[-1]], abs=1e-6)
