"""The OpenVINO target (`--format openvino`): an IR (`<name>.xml` + `.bin`) converted from the ONNX file.

`openvino.convert_model` reads the verified ONNX graph; weights stay float32. The IR is verified
against the PyTorch model on the same batches and with the same bound as the ONNX file
(`project.export.verify`). `infer` and `serve` load it with `project.deploy.openvino_runtime`,
without torch. OpenVINO is optional (`pip install openvino`): without it, `--format openvino` is
one UserError before any work.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from project.deploy.openvino_runtime import OpenVINOSession, import_openvino
from project.deploy.outputs import Outputs

if TYPE_CHECKING:
    from project.export.target import Files, Runner, Source

# renamed into place in this order: the weights first, so that a graph under its final name
# always has its weights beside it
SUFFIXES = ("bin", "xml")


def require() -> None:
    """Nothing when OpenVINO is installed; else the UserError saying how to install it."""
    import_openvino("`export --format openvino`")


def version() -> str:
    return import_openvino("The OpenVINO export").get_version()


def convert(source: Source, files: Files) -> bool:
    """The IR of the ONNX file written (and verified) before it."""
    write_ir(source.files["onnx"], files["xml"], files["bin"])
    return True


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


def load(files: Files) -> Runner:
    """The IR compiled for the CPU in float32, as infer and serve run it."""
    session = OpenVINOSession(files["xml"], weights=files["bin"])

    def run(images: np.ndarray) -> Outputs:
        names = [output.name for output in session.get_outputs()]
        return Outputs.of(names, session.run(names, {"images": images}))

    return run
