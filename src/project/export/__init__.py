"""Export: a checkpoint to files that run without the training code, each verified against PyTorch.

    options.py          ExportOptions: the options of `export` and of the end-of-fit `--export_best`
    checkpoint.py       export_checkpoint: read, write each target verified, describe, publish
    deployable.py       the module exported: uint8 images -> logits, normalization baked in
    targets.py          TARGETS: the one table of export targets (how each is written and loaded)
    onnx_target.py      ONNX, run by onnxruntime; pt2_target.py: torch.export's .pt2;
    openvino_target.py  `--format openvino`: an OpenVINO IR converted from the ONNX file  # room: openvino
    verify.py           the comparison with PyTorch on random and real images, and its bound
    validation.py       the validation images an export measures on, and the model's outputs there
    # room: calibration begin
    fit_calibration.py  the temperature fitted on validation
                        (`project.deploy.calibration` applies it, without torch)
    # room: calibration end
    fit_unknown.py      the unknown score and threshold, measured on foreign.py's images  # room: unknown
    quantize.py         `--quantize int8`: onnxruntime static quantization, measured  # room: int8

Everything here needs torch; what runs an export lives in `project.deploy`, without it.
"""

from project.export.checkpoint import Exported, export_checkpoint
from project.export.deployable import Deployable, load_for_export
from project.export.options import ExportOptions
from project.export.targets import TARGETS, Target
from project.export.verify import (
    ATOL,
    ROUNDING,
    RTOL,
    ExportError,
    validation_images,
    verification_batches,
    verify,
)

__all__ = [
    "ATOL",
    "ROUNDING",
    "RTOL",
    "TARGETS",
    "Deployable",
    "ExportError",
    "ExportOptions",
    "Exported",
    "Target",
    "export_checkpoint",
    "load_for_export",
    "validation_images",
    "verification_batches",
    "verify",
]
