"""Quiet by default: Lightning's messages that do not help a user of this template, dropped in one place.

Each is matched on its own text, so a new message from Lightning still shows.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
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
DROPPED_WARNINGS = (
    # raised inside Lightning 2.6 (utilities/_pytree.py) on every fit by torch >= 2.10; nothing to change
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # on every small data set: the template logs every epoch's metrics and the step curves it has
    r"The number of training batches \(\d+\) is smaller than the logging interval",
    # predict/validate/test --ckpt_path of a fit: its Timer's state is in the checkpoint, the Timer is
    # fit's (the time budget) and nothing else needs it
    r"(?s).*Please add the following callbacks: \['Timer'\]\.$",
)
PACKAGE_FOLDER = str(Path(__file__).parent)


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
    if not getattr(warnings.formatwarning, "plain", False):
        warnings.formatwarning = _plain(warnings.formatwarning)


def _plain(default: Any) -> Any:
    """The template's own warnings as one `warning: <message>` line: Python's format adds the file,
    the line number and the source line of the call (a stray `rank_zero_warn(` line)."""

    def format_warning(message: Any, category: type, filename: str, lineno: int, line: Any = None) -> str:
        if str(filename).startswith(PACKAGE_FOLDER):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    format_warning.plain = True  # type: ignore[attr-defined]
    return format_warning


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
