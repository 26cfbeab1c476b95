"""The OpenVINO export target: an IR (`<name>.xml` + `<name>.bin`) converted from the ONNX export.

`export --format openvino` writes the ONNX file as always, then the IR beside it
(`openvino.convert_model` reads the ONNX graph; weights stay float32), and verifies the IR
against the PyTorch model on the same batches and with the same bound as the ONNX file
(`project.export.ATOL` + `RTOL` x max |logit|). `infer` and `serve` load it with
`project.deploy.openvino_runtime`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from project.deploy.openvino_runtime import OpenVINOSession, import_openvino
from project.export import ATOL, RTOL, ExportError

NAME = "openvino"  # the `--format` value, the sidecar's `files` and `verification.results` key
# the files the target writes beside the ONNX file, renamed into place in this order: the weights
# first, so that a graph under its final name always has its weights beside it
SUFFIXES = ("bin", "xml")


def require() -> None:
    """Nothing when OpenVINO is installed; else the UserError saying how to install it (before any work)."""
    import_openvino("`export --format openvino`")


def export_ir(
    model: nn.Module,
    onnx_path: Path,
    paths: dict[str, Path],
    batches: dict[str, torch.Tensor],
    metadata: dict,
    final: dict[str, Path],
) -> None:
    """Write the IR of `onnx_path` to `paths["xml"]`/`paths["bin"]`, verify it, record it in `metadata`.

    `final` holds the names the files get once the export is complete: the sidecar names those.
    Raises ExportError when the IR does not agree with `model`.
    """
    write_ir(onnx_path, paths["xml"], paths["bin"])
    results = verify_ir(model, paths["xml"], paths["bin"], batches)
    metadata["verification"]["results"][NAME] = results
    metadata["files"][NAME] = final["xml"].name
    metadata["versions"][NAME] = import_openvino("The OpenVINO export").get_version()


def write_ir(onnx_path: Path, xml: Path, weights: Path) -> None:
    """The IR of the ONNX file at `onnx_path`, its graph at `xml` and its float32 weights at `weights`."""
    ov = import_openvino("`export --format openvino`")
    converted = ov.convert_model(str(onnx_path))
    # save_model names the .bin after the .xml; the export's temporary names differ, so it writes
    # into a folder of its own beside them and the two files are linked under the temporary names
    with tempfile.TemporaryDirectory(dir=xml.parent, prefix=".openvino-") as folder:
        saved = Path(folder) / "model.xml"
        # float32 as verified: save_model's default halves the weights to float16
        ov.save_model(converted, str(saved), compress_to_fp16=False)
        os.link(saved, xml)
        os.link(saved.with_suffix(".bin"), weights)


def verify_ir(model: nn.Module, xml: Path, weights: Path, batches: dict[str, torch.Tensor]) -> dict:
    """Per batch: the IR's logits against `model`'s (the ONNX rule); ExportError on any mismatch."""
    session = OpenVINOSession(xml, weights=weights)
    report: dict[str, dict] = {}
    failures = []
    for name, batch in batches.items():
        with torch.no_grad():
            expected = model(batch).numpy()
        logits = session.run(["logits"], {"images": batch.numpy()})[0]
        scale = float(np.abs(expected).max())
        bound = ATOL + RTOL * scale
        diff = float(np.abs(logits - expected).max())
        same_top1 = bool((logits.argmax(1) == expected.argmax(1)).all())
        report[name] = {"max_abs_diff": diff, "max_abs_logit": scale, "bound": bound, "top1_equal": same_top1}
        if not (diff <= bound and same_top1):
            failures.append(
                f"{name}: max |logit diff| {diff:.2e} (bound {bound:.2e}), top-1 equal: {same_top1}"
            )
    if failures:
        raise ExportError(
            f"OpenVINO verification failed ({'; '.join(failures)}; bound {ATOL:g} + {RTOL:g} x max |logit|); "
            "no file was kept.",
            "export without --format openvino (ONNX only), or try another openvino release.",
        )
    return report
