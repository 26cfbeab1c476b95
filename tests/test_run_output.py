"""What a user sees from `fit` with its output in a file: per-epoch lines, no noise, a closing block that
names every folder and file of the run, and TensorBoard events that open on accuracy and loss."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2  # room: dashboard

import project

# room: dashboard begin
from project.callbacks.scalars_layout import LAYOUT

# room: dashboard end
# room: pictures begin
from project.figures import MAX_GRID_WIDTH

# room: pictures end
from tests.helpers import fast_args


@pytest.mark.slow
def test_fit_to_a_file_prints_epoch_lines_and_where_everything_went(workdir: Path, shapes_root: Path) -> None:
    """A real tiny fit, its output in files (not a terminal), with progress bar, summary and export on."""
    args = [
        *fast_args(shapes_root, "--name=tiny", "--model.backbone=mobilenet_v3_small"),
        "--trainer.max_epochs=2",
        "--trainer.enable_progress_bar=true",
        "--trainer.enable_model_summary=true",
        "--export_best.enabled=true",
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(project.__file__).resolve().parents[1])}
    with open(workdir / "out.txt", "w") as out, open(workdir / "err.txt", "w") as err:
        status = subprocess.run(
            [sys.executable, "-m", "project", "fit", *args], cwd=workdir, env=env, stdout=out, stderr=err
        ).returncode
    stdout, stderr = (workdir / "out.txt").read_text(), (workdir / "err.txt").read_text()
    assert status == 0, stderr

    assert "Trainable params" in stderr  # the model summary
    # room: console begin
    output = stdout + stderr
    # quiet: none of Lightning's noise, no progress bar redrawn with carriage returns
    for noise in ("💡 Tip", "litlogger", "LeafSpec", "estimate number of stepping batches", "FLOPs", "Flops"):
        assert noise not in output
    assert "\r" not in output
    epochs = [line for line in stdout.splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 1/2", "epoch 2/2"]
    for line in epochs:
        assert all(f"{name} " in line for name in ("train/loss", "val/loss", "val/acc"))
        assert line.endswith(" s)")
    assert len(stdout) < 4000
    # room: console end

    # the closing block: the real paths of this run
    run = workdir / "checkpoints" / "tiny"
    best = next(run.glob("epoch=*.ckpt"))  # save_top_k=3 keeps both epochs: the best is named in the block
    export = (run / "latest.onnx").resolve()
    assert export.is_file() and export.parent == run
    block = stdout[stdout.index("Run 'tiny' finished") :]
    assert "  logs:         logs/tiny/" in block
    assert "  checkpoints:  checkpoints/tiny/" in block
    assert "  last:         checkpoints/tiny/last.ckpt" in block
    assert f"  export:       checkpoints/tiny/{export.name}" in block
    assert f"checkpoints/tiny/latest.onnx -> {export.name}" in block
    best_line = next(line for line in block.splitlines() if line.startswith("  best:"))
    score, path = best_line.split()[2:4]
    assert path.startswith("checkpoints/tiny/epoch=") and (workdir / path).is_file() and best.is_file()
    assert path.endswith(f"val_acc={float(score):.4f}.ckpt")
    for command in (
        "tensorboard --logdir logs",
        # room: report begin
        "python -m project report tiny",
        # room: report end
        f"python -m project predict --ckpt_path {path} --data.predict_dir=IMAGES",
        "python -m project infer --model checkpoints/tiny/latest.onnx IMAGES",
        # room: serve begin
        "python -m project serve --model checkpoints/tiny/latest.onnx",
        # room: serve end
    ):
        assert f"  {command}\n" in block + "\n"

    events = EventAccumulator(str(workdir / "logs" / "tiny"), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    # room: dashboard begin
    # TensorBoard: the custom scalars layout puts accuracy and loss first
    layout = layout_pb2.Layout()
    layout.ParseFromString(events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    first = layout.category[0]
    assert [c.title for c in layout.category] == list(LAYOUT)
    assert [list(chart.multiline.tag) for chart in first.chart] == [
        ["val/acc", "val/acc_best"],
        ["train/loss", "val/loss"],
    ]
    # room: dashboard end
    scalars = set(events.Tags()["scalars"])
    assert {"val/acc", "val/acc_best", "train/loss", "val/loss"} <= scalars  # what TensorBoard opens on
    # room: pictures begin
    for tag in ("train/images", "val/misclassified"):  # image grids fit TensorBoard's card
        assert events.Images(tag)[-1].width <= MAX_GRID_WIDTH
    # room: pictures end
