"""Lightning's model summary without its FLOPs column, which is all zeros for this template's models."""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.callbacks import ModelSummary

# private Lightning API, checked against lightning 2.6 (the pin is <2.7)
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table
from typing_extensions import override


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
