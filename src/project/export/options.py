"""The options of an export, declared once: the `export` command and the end-of-fit export take them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

# room: unknown begin
from project.deploy.unknown import DEFAULT_ACCEPT, SCORES

# room: unknown end
from project.errors import UserError
from project.export.targets import FORMATS

# --format: ONNX (+ .pt2), or also an optional target beside them: the names come from the targets' table
Format = Literal[FORMATS]  # type: ignore[valid-type]


# `calibrate` is described twice below: help shows the second, the unknown room's  # room: unknown
@dataclass(frozen=True)
class ExportOptions:
    """How a checkpoint is exported; each value is checked here, before anything is written.

    `Trainer.export` and `ExportBest` take these fields as their own options (`--opset`,
    `--export_best.opset`, ...): jsonargparse follows their `**options` into this class.

    Args:
        opset: ONNX opset version.
        # room: unknown begin
        unknown_accept: Share of validation images the unknown threshold accepts; below it
            infer/serve/predict answer `unknown`. 0 or null: no rejection.
        unknown_score: What the threshold applies to: `auto` (the score that answers the most of the
            foreign images export makes `unknown`), `knn` (features), `energy` or `max_probability`.
        # room: unknown end
        # room: int8 begin
        quantize: `int8`: also write `<name>-int8.onnx` (static quantization), measured against
            the float model.
        # room: int8 end
        calibrate: Fit the temperature on the validation split (false: plain softmax).  # room: calibration
        # room: unknown begin
        calibrate: Fit the temperature and the unknown threshold (false: plain softmax, never
            `unknown`).
        # room: unknown end
        format: `openvino`: also write an OpenVINO IR (`<name>.xml` + `.bin`) from the ONNX
            file, verified against PyTorch the same way (needs `pip install openvino`).
    """

    opset: int = 18
    unknown_accept: float | None = DEFAULT_ACCEPT  # room: unknown
    unknown_score: Literal["auto", "knn", "energy", "max_probability"] = "auto"  # room: unknown
    quantize: Literal["int8"] | None = None  # room: int8
    calibrate: bool = True  # room: calibration
    format: Format = "onnx"

    def __post_init__(self) -> None:
        # room: unknown begin
        if self.unknown_accept is not None and not 0 <= self.unknown_accept <= 1:
            raise UserError(
                f"unknown_accept={self.unknown_accept} is not a share from 0 to 1.",
                "pass e.g. unknown_accept=0.95 (accept 95% of validation images), "
                "or 0 to turn rejection off.",
            )
        if self.unknown_score not in ("auto", *SCORES):
            raise UserError(
                f"unknown_score={self.unknown_score!r} is not a known score.",
                f"pass auto or one of {', '.join(SCORES)}.",
            )
        # room: unknown end
        if self.format not in get_args(Format):
            raise UserError(
                f"format={self.format!r} is not an export target.",
                f"pass --format {' or '.join(get_args(Format))}.",
            )
        # room: int8 begin
        if self.quantize not in (None, "int8"):
            raise UserError(
                f"quantize={self.quantize!r} is not supported.", "pass --quantize int8, or leave it out."
            )
        # room: int8 end
