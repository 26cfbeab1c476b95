"""A quiet console: the template's own warnings as one line each.
# room: console begin
Lightning's messages that do not help a user of this template are dropped in one place (each matched on
its own text, so a new message from Lightning still shows).
# room: console end
"""

from __future__ import annotations

import logging  # room: console
import warnings
from pathlib import Path
from typing import Any

# room: console begin
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


class _DropInfo(logging.Filter):
    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(DROPPED_INFO)


# room: console end
PACKAGE_FOLDER = str(Path(__file__).parent)


def quiet_lightning() -> None:
    """Print the template's own warnings as one line (idempotent).
    # room: console begin
    Drop DROPPED_INFO from Lightning's loggers and DROPPED_WARNINGS from its warnings.
    # room: console end
    """
    # room: console begin
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropInfo) for f in logger.filters):
            logger.addFilter(_DropInfo())
    for message in DROPPED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    # room: console end
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
