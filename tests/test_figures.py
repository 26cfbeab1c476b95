"""Pictures and tables that grow with the class count stay the same size past a few dozen classes."""

from __future__ import annotations

import itertools  # room: report
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torchmetrics.classification import MulticlassConfusionMatrix

from project import figures
from project.callbacks import ConfusionMatrix
from project.callbacks.confusion_matrix import _Counts, top_confusions_table
from project.model import ImageClassifier
from tests.helpers import TensorData, tiny_trainer

CLASSES = 2000


def many_class_counts() -> np.ndarray:
    """A 2,000-class confusion matrix: 5 right per class, and three known confusions."""
    counts = np.zeros((CLASSES, CLASSES), dtype=np.int64)
    np.fill_diagonal(counts, 5)
    counts[7, 1999] = 9  # the top confusion
    counts[1500, 3] = 4
    counts[42, 43] = 2
    return counts


def test_top_confusions_are_found_in_blocks() -> None:
    counts = many_class_counts()
    assert figures.top_confusions(counts, 5, block=100) == [(7, 1999, 9), (1500, 3, 4), (42, 43, 2)]
    assert figures.confused_classes(counts) == [3, 7, 42, 43, 1500, 1999]
    assert figures.confused_classes(np.eye(60, dtype=np.int64)) == list(range(50))  # nothing confused


def peak_bytes(draw, *args: object) -> tuple[np.ndarray, int]:
    """What `draw` returns, and the most memory it held at once beyond what existed before."""
    tracemalloc.start()
    try:
        return draw(*args), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_many_class_confusion_matrix_is_drawn_in_bounded_size_and_memory() -> None:
    counts = many_class_counts()
    names = [f"class-{i}" for i in range(CLASSES)]
    image, peak = peak_bytes(figures.confusion_matrix, counts, names, "validation:")
    few = np.eye(figures.MAX_DRAWN, dtype=np.int64)
    reference, reference_peak = peak_bytes(figures.confusion_matrix, few, names[: figures.MAX_DRAWN])
    assert image.shape == reference.shape == (1400, 1520, 3)  # 14 x 15.2 inches at 100 dpi at most
    # as much as a 50-class picture (mostly matplotlib's resampling at the figure's size, ~70 MB):
    # no copy of the 32 MB of counts, and the same for 10,000 classes
    assert peak < reference_peak + 8e6, f"{peak / 1e6:.0f} MB against {reference_peak / 1e6:.0f} MB"
    figure = Figure()
    ax = figure.add_subplot()
    figures.draw_confusion_matrix(ax, counts, names)
    assert [t.get_text() for t in ax.get_yticklabels()] == [names[i] for i in (3, 7, 42, 43, 1500, 1999)]
    assert "the 6 most confused of 2000 classes" in ax.get_title()
    assert "(accuracy 0.999)" in ax.get_title()  # of all classes: 10,000 right of 10,015


def test_per_class_accuracy_of_many_classes_shows_the_lowest_and_highest() -> None:
    accuracy = np.linspace(0, 1, CLASSES)
    names = [f"c{i}" for i in range(CLASSES)]
    ax = Figure().add_subplot()
    figures.draw_per_class(ax, accuracy, names)
    assert len(ax.patches) == figures.MAX_DRAWN
    shown = [t.get_text() for t in ax.get_yticklabels()]
    assert shown[-1] == "c0" and shown[0] == "c1999"  # lowest on top
    assert "the 25 lowest and highest of 2000 classes" in ax.get_xlabel()


# room: report begin
@pytest.mark.parametrize(("classes", "smallest"), [(6, 14), (30, 7.5)])
def test_per_class_labels_are_as_large_as_their_rows_allow(classes: int, smallest: float) -> None:
    from project.report import Run, draw_report

    names = [f"class-{i}" for i in range(classes)]
    run = Run("r", {f"val_class_acc/{n}": (np.array([1]), np.array([0.5])) for n in names}, class_names=names)
    figure = draw_report(run)
    figure.canvas.draw()
    ax = figure.axes[-1]  # the per-class panel, drawn in the report's layout
    labels = ax.get_yticklabels()
    assert min(label.get_fontsize() for label in labels) >= smallest  # 8 pt before: unreadable on a page
    boxes = [label.get_window_extent() for label in labels]
    assert all(a.y1 <= b.y0 + 1 for a, b in itertools.pairwise(boxes))  # no label overlaps the next


# room: report end
def test_the_top_confusions_table_names_the_pairs() -> None:
    names = [f"class-{i}" for i in range(CLASSES)]
    lines = top_confusions_table(many_class_counts(), names).splitlines()
    assert lines[1].split() == ["9", "64.3%", "class-7", "->", "class-1999"]  # 9 of 14 images of class 7
    assert len(lines) == 4


@pytest.mark.slow
def test_a_300_class_validation_logs_the_top_confusions_instead_of_the_counts(tmp_path: Path) -> None:
    model = ImageClassifier(num_classes=300, backbone="resnet18", scheduler=None)
    images = torch.randint(0, 256, (16, 3, 16, 16), dtype=torch.uint8)
    logger = TensorBoardLogger(tmp_path, name="", version="")
    trainer = tiny_trainer(ConfusionMatrix(), logger=logger, limit_train_batches=1, num_sanity_val_steps=0)
    trainer.fit(model, TensorData(images, torch.arange(16) * 17))
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert "val/confusion_matrix_counts" not in events.Tags()["tensors"]  # 300² numbers per epoch
    assert events.Tags()["images"] == ["val/confusion_matrix"]
    text = events.Tensors("val/top_confusions/text_summary")
    table = text[-1].tensor_proto.string_val[0].decode()
    assert "true -> predicted" in table and len(table.splitlines()) <= 23  # a code block: 20 pairs at most


def test_confusion_counts_match_torchmetrics_without_a_classes_squared_step() -> None:
    generator = torch.Generator().manual_seed(0)
    reference, counts = MulticlassConfusionMatrix(7), _Counts(7)
    for _ in range(3):
        preds, target = (
            torch.randint(0, 7, (32,), generator=generator),
            torch.randint(0, 7, (32,), generator=generator),
        )
        reference.update(preds, target)
        counts.update(preds, target)
    assert torch.equal(counts.compute(), reference.compute())
    many = _Counts(4000)  # torchmetrics' own update: ~0.1 s per batch here (a 4000² bincount)
    preds, target = torch.randint(0, 4000, (64,)), torch.randint(0, 4000, (64,))
    start = time.perf_counter()
    for _ in range(10):
        many.update(preds, target)
    assert time.perf_counter() - start < 0.3
    assert int(many.compute().sum()) == 640


ODD = r"$\undefinedcmd$"  # a class folder's name: mathtext would fail to parse it


def test_names_are_drawn_as_text_never_as_mathtext() -> None:
    names = [ODD, "$x^2$", "price $5"]
    grid = np.zeros((40, 3 * 40, 3), dtype=np.uint8)
    assert figures.image_grid(grid, names, columns=3, cell=36, padding=4, title=ODD).ndim == 3
    assert figures.confusion_matrix(np.eye(3, dtype=np.int64) * 2 + 1, names, ODD).ndim == 3
    ax = Figure().add_subplot()
    figures.draw_per_class(ax, [0.5, 0.9, 0.1], names)
    assert [t.get_text() for t in ax.get_yticklabels()] == names[::-1]
    with figures.plain_text():
        figures.to_rgb(ax.figure)
