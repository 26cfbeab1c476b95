"""lr_find and batch_size_find: Lightning's Tuner run on the configured model and data, reported as a flag."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from project.tuning import SKIP_BEGIN, debiased, fit_command, lr_plot, no_temporary_files, suggested_rate
from tests.helpers import fast_args, run_cli, tiny_trainer

QUIET = (
    "--training_images.enabled=false",
    "--confusion_matrix.enabled=false",
    "--misclassified.enabled=false",
)


def temporary_checkpoints(folder: Path) -> list[Path]:
    return [*folder.rglob(".lr_find_*.ckpt"), *folder.rglob(".scale_batch_size_*.ckpt")]


@pytest.mark.slow
def test_lr_find_prints_the_flag_and_writes_the_plot(
    workdir: Path, shapes_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # batches of 4: the 14 steps fit in about one epoch (each epoch adds a validation)
    args = fast_args(
        shapes_root, "--name=probe", "--num_training=14", "--max_lr=0.05", "--data.batch_size=4", *QUIET
    )
    assert run_cli("lr_find", *args) == 0
    out = capsys.readouterr().out
    lr = float(out.split("Suggested learning rate: ")[1].split()[0])
    assert 1e-6 <= lr <= 0.05
    fit = next(line for line in out.splitlines() if line.startswith("Use it: "))
    assert fit.startswith("Use it: python -m project fit --data.root=")
    assert fit.endswith(f"--model.optimizer.init_args.lr={lr:.2g}")
    assert "--name" not in fit and "--num_training" not in fit  # the finder's own options are not fit's
    assert "Run 'probe'" not in out and "Next:" not in out  # the finder's fit has no run to sum up
    png = workdir / "logs" / "probe" / "lr_find.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert temporary_checkpoints(workdir) == []
    assert not (workdir / "checkpoints" / "probe").exists()


@pytest.mark.slow
def test_batch_size_find_prints_the_largest_batch(
    workdir: Path, shapes_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = fast_args(shapes_root, "--max_val=8", "--steps_per_trial=1", *QUIET)
    assert run_cli("batch_size_find", *args) == 0
    out = capsys.readouterr().out
    assert "Largest batch size that fit: 8" in out  # 2, 4, 8: a CPU never runs out before max_val
    fit = out.rstrip().splitlines()[-1]
    assert fit.endswith("--data.batch_size=8") and fit.count("--data.batch_size") == 1  # not 16, then 8
    assert temporary_checkpoints(workdir) == []


def test_a_failed_search_leaves_no_restore_file(tmp_path: Path) -> None:
    trainer = tiny_trainer(default_root_dir=tmp_path)
    with pytest.raises(RuntimeError), no_temporary_files(trainer):
        (tmp_path / ".lr_find_1234.ckpt").write_bytes(b"model")  # as the Tuner's save before a trial
        raise RuntimeError("trial failed")
    assert temporary_checkpoints(tmp_path) == []


def test_fit_command_drops_the_finder_options() -> None:
    args = ["--data.root=x", "--min_lr", "1e-7", "--name=a", "--max_trials=3", "--model.backbone=resnet18"]
    assert fit_command(args, "--data.batch_size=64") == (
        "python -m project fit --data.root=x --model.backbone=resnet18 --data.batch_size=64"
    )


def test_fit_command_replaces_the_option_it_sets() -> None:
    args = [
        "--data.batch_size=16",
        "--data.root=x",
        "--data.batch_size",
        "32",
        "--model.optimizer.init_args.lr=1",
    ]
    assert fit_command(args, "--data.batch_size=64") == (
        "python -m project fit --data.root=x --model.optimizer.init_args.lr=1 --data.batch_size=64"
    )
    assert fit_command(args[-1:], "--model.optimizer.init_args.lr=0.003").endswith(
        "fit --model.optimizer.init_args.lr=0.003"
    )


LRS = [10 ** (-6 + k / 4) for k in range(25)]  # 1e-6 ... 1, as the range test spaces them


def test_the_rate_is_the_steepest_point_of_the_descent_to_the_minimum() -> None:
    losses = [2.0] * 8 + [1.9, 1.6, 1.2, 1.0, 0.9, 0.85] + [1.0 + 0.4 * k for k in range(11)]
    # falls fastest around step 9; the rise past the minimum (step 13) is steeper, and not taken
    assert suggested_rate(LRS, losses) == (LRS[9], None)


def test_a_descent_too_short_to_read_falls_back_to_a_tenth_of_the_minimum() -> None:
    losses = [2.0 + 0.01 * k for k in range(10)] + [1.0] + [1.1 + 0.2 * k for k in range(14)]
    lr, warning = suggested_rate(LRS, losses)
    assert lr == pytest.approx(LRS[10] / 10)
    assert warning is not None and f"minimum at {LRS[10]:.1e} is too short" in warning


def test_a_loss_that_only_rises_falls_back_to_the_smallest_rate_tried() -> None:
    losses = [1.0 + 0.1 * k for k in range(len(LRS))]
    lr, warning = suggested_rate(LRS, losses)
    assert lr == LRS[0] and warning is not None and "the loss rose from the first rates tried" in warning


def test_a_curve_that_turns_nan_early_still_gets_a_rate() -> None:
    lrs = np.geomspace(1e-6, 1.0, 100).tolist()
    losses = [2.0 - 0.01 * k for k in range(15)] + [float("nan")] * 85  # a NaN loss: every later average
    lr, _ = suggested_rate(lrs, losses)
    assert lrs[0] <= lr <= lrs[14]


def lightnings_curve(raw: list[float], beta: float = 0.98) -> list[float]:
    """What Lightning's _LRCallback records for batch losses `raw` (global_step counts the step taken,
    NaN too: a step whose training_step gave no loss, recorded as NaN and left out of the average)."""
    recorded, average = [], 0.0
    for step, loss in enumerate(raw, start=1):
        if np.isnan(loss):
            recorded.append(loss)
            continue
        average = beta * average + (1 - beta) * loss
        recorded.append(average / (1 - beta ** (step + 1)))
    return recorded


def test_a_curve_that_hardly_falls_says_the_rate_is_a_guess() -> None:
    losses = [1.795 - 0.015 * k / 24 for k in range(25)]  # a steady fall of 0.8%, 0.7% past the first steps
    lr, warning = suggested_rate(LRS, losses)
    assert LRS[5] <= lr < LRS[24] and warning is not None
    assert warning.startswith(
        "The loss fell by only 0.7% on its way to its minimum (1.79 to 1.78 past the first 5"
    )


def test_the_recorded_curve_is_debiased_to_the_batch_losses_average() -> None:
    recorded = lightnings_curve([2.0] * 60)
    assert recorded[0] == pytest.approx(2.0 / 1.98) and recorded[5] < 1.75  # a flat loss seen rising
    assert debiased(recorded) == pytest.approx([2.0] * 60)
    with_nan = debiased(lightnings_curve([float("nan"), 2.0, float("nan"), *[2.0] * 30]))
    assert np.isnan(with_nan[0]) and np.isnan(with_nan[2])
    assert [with_nan[1], *with_nan[3:]] == pytest.approx([2.0] * 31)


def test_a_model_that_learns_late_is_told_a_rate_on_its_descent() -> None:
    """A tiny timm model's range test: its batch losses drift up with noise until the rates near 1e-3,
    then fall. As Lightning records them, the curve's lowest point was its first (half the first batch's
    loss), and 1e-6, the first rate tried, was suggested."""
    lrs = np.geomspace(1e-6, 1.0, 100)
    x = np.log10(lrs)
    raw = 2.2 + 0.25 / (1 + np.exp(-3 * (x + 4.5))) + 0.03 * np.sin(12 * x)  # drift and noise
    raw += -0.7 / (1 + np.exp(-4 * (x + 2.5))) + 0.8 * np.maximum(x + 1.5, 0) ** 2  # learns, then diverges
    recorded = lightnings_curve(raw.tolist())
    assert int(np.argmin(recorded)) == 0
    losses = debiased(recorded)
    lr, warning = suggested_rate(lrs.tolist(), losses)
    peak, minimum = int(np.argmax(losses[SKIP_BEGIN:80])) + SKIP_BEGIN, int(np.argmin(losses))
    assert lrs[peak] < lr < lrs[minimum] and 1e-3 < lr < 0.1 and warning is None


def test_the_lr_plot_is_drawn_as_plain_text_whatever_the_matplotlibrc() -> None:
    """A matplotlibrc with `text.usetex: true` (without LaTeX) failed the picture, after the search."""
    import matplotlib
    from lightning.pytorch.tuner.lr_finder import _LRFinder

    finder = _LRFinder(mode="exponential", lr_min=1e-5, lr_max=1.0, num_training=20)
    lrs = np.geomspace(1e-5, 1.0, 20)
    finder.results = {"lr": lrs.tolist(), "loss": (2 - np.tanh(np.log10(lrs) + 3)).tolist()}
    with matplotlib.rc_context({"text.usetex": True}):
        png = lr_plot(finder, 1e-3)
    assert png.startswith(b"\x89PNG")


def test_the_lr_plot_marks_the_rate_the_command_prints() -> None:
    """The plot marks the rate printed, not Lightning's own pick."""
    import matplotlib.pyplot as plt
    from lightning.pytorch.tuner.lr_finder import _LRFinder

    from project.tuning import lr_figure

    finder = _LRFinder(mode="exponential", lr_min=1e-5, lr_max=1.0, num_training=20)
    lrs = np.geomspace(1e-5, 1.0, 20)
    finder.results = {"lr": lrs.tolist(), "loss": (2 - np.tanh(np.log10(lrs) + 3)).tolist()}
    printed = float(lrs[4])  # not where Lightning's steepest-fall rule would put it
    figure = lr_figure(finder, printed)
    marked = [line for line in figure.axes[0].lines if line.get_marker() == "o"]
    assert [float(line.get_xdata()[0]) for line in marked] == [printed]
    assert figure.axes[0].get_title() == f"Suggested learning rate {printed:.1e}"
    plt.close(figure)


def test_the_lr_plots_ticks_are_plain_numbers() -> None:
    """Drawn as plain text, matplotlib's log-axis labels showed their mathtext source under the plot."""
    import matplotlib.pyplot as plt
    from lightning.pytorch.tuner.lr_finder import _LRFinder

    from project.figures import plain_text
    from project.tuning import lr_figure

    finder = _LRFinder(mode="exponential", lr_min=1e-6, lr_max=1.0, num_training=20)
    lrs = np.geomspace(1e-6, 1.0, 20)
    finder.results = {"lr": lrs.tolist(), "loss": (2 - np.tanh(np.log10(lrs) + 3)).tolist()}
    with plain_text():
        figure = lr_figure(finder, float(lrs[4]))
        figure.canvas.draw()
        labels = [label.get_text() for label in figure.axes[0].get_xticklabels() if label.get_text()]
    plt.close(figure)
    labels = [label.replace("\N{MINUS SIGN}", "-") for label in labels]  # matplotlib's minus sign
    assert {"1e-06", "1e-03", "1"} <= set(labels) and not [label for label in labels if "$" in label]
