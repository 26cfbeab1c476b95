"""The metrics a model logs, and the name of the one that selects checkpoints.

MONITOR is read by commands that import no torch (report, sweep), so torchmetrics is imported by the
functions that build metrics, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchmetrics import MetricCollection

# the monitored metric: checkpoint selection and its file names, the export's fallback name for its score,
# a sweep's default objective (the presets and sweeps in configs/ spell it out: a test holds them to it)
MONITOR = "val/acc"


def classification_metrics(num_classes: int, prefix: str) -> MetricCollection:
    """Accuracy, balanced accuracy (the mean of the per-class recalls) and macro F1, plus top-5 accuracy
    when there are more than 5 classes."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    metrics = {
        "acc": MulticlassAccuracy(num_classes, average="micro"),
        "balanced_acc": MulticlassAccuracy(num_classes, average="macro"),
        "f1_macro": MulticlassF1Score(num_classes, average="macro"),
    }
    if num_classes > 5:
        metrics["top5_acc"] = MulticlassAccuracy(num_classes, top_k=5, average="micro")
    # compute groups would share state between top-1 and top-5 accuracy when they happen to agree
    return MetricCollection(metrics, prefix=prefix, compute_groups=False)


# room: multilabel begin
def multilabel_metrics(num_labels: int, threshold: float, prefix: str) -> MetricCollection:
    """Accuracy and F1 averaged over labels, mean average precision, and exact match of the label sets."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import (
        MultilabelAccuracy,
        MultilabelAveragePrecision,
        MultilabelExactMatch,
        MultilabelF1Score,
    )

    metrics = {
        "acc": MultilabelAccuracy(num_labels, threshold, average="macro"),
        "f1_macro": MultilabelF1Score(num_labels, threshold, average="macro"),
        "map": MultilabelAveragePrecision(num_labels, average="macro"),
        "exact_match": MultilabelExactMatch(num_labels, threshold),
    }
    return MetricCollection(metrics, prefix=prefix, compute_groups=False)


def per_label_metrics(num_labels: int, threshold: float, prefix: str) -> MetricCollection:
    """Accuracy and F1 of every label (vectors): logged as `<prefix>acc/<label>` and `<prefix>f1/<label>`."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MultilabelAccuracy, MultilabelF1Score

    metrics = {
        "acc": MultilabelAccuracy(num_labels, threshold, average="none"),
        "f1": MultilabelF1Score(num_labels, threshold, average="none"),
    }
    return MetricCollection(metrics, prefix=prefix, compute_groups=False)


# room: multilabel end
