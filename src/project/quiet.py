"""Quiet by default: Lightning's messages that do not help a user of this template, dropped in one place.

Each is matched on its own text, so a new message from Lightning still shows.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from lightning.pytorch.callbacks import ModelSummary

# private Lightning API, checked against lightning 2.6 (the pin is <2.7)
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table
from typing_extensions import override

# rank_zero_info lines: an advertisement, a note on an internal step, and the note that our own
# model summary replaces Lightning's default one
DROPPED_INFO = (
    "💡 Tip: For seamless cloud logging",
    "Loading `train_dataloader` to estimate number of stepping batches",
    "Trainer already configured with model summary callbacks",
)
# raised inside Lightning 2.6 (utilities/_pytree.py) on every fit by torch >= 2.10; nothing a user can change
DROPPED_WARNINGS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated",)


class _DropInfo(logging.Filter):
    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(DROPPED_INFO)


def quiet_lightning() -> None:
    """Drop the messages above from Lightning's loggers and warnings (idempotent)."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropInfo) for f in logger.filters):
            logger.addFilter(_DropInfo())
    for message in DROPPED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


class CompactModelSummary(ModelSummary):
    """Lightning's model summary without its FLOPs column and total, which are all 0: Lightning counts
    FLOPs only for a model with an `example_input_array`, and ours takes any image size."""

    @staticmethod
    @override
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        columns = [column for column in summary_data if column[0] != "FLOPs"]
        text = _format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *columns
        )
        lines = [line for line in text.split("\n") if not line.endswith("Total Flops")]
        logging.getLogger("lightning.pytorch.callbacks.model_summary").info("\n" + "\n".join(lines))
