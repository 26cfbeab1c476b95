"""Run an OpenVINO IR (`<name>.xml` + `<name>.bin`) with the call shape of an onnxruntime session.

`OpenVINOSession(xml).run(["logits"], {"images": batch})` answers as
`onnxruntime.InferenceSession.run` does, so `infer` and `serve` take either file. OpenVINO is an
optional package (`pip install openvino`, or the `openvino` extra); without it, loading an IR is
one UserError.
Importing this module imports neither torch nor openvino.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np

from project.errors import UserError, missing_package

SUFFIX = ".xml"  # the IR's graph; its weights are the .bin of the same stem
# Export verifies the IR in float32. OpenVINO's CPU plugin otherwise picks bf16 on CPUs that have
# it (AMX, AVX512-BF16), which moves logits by far more than the verification bound allows.
PRECISION = {"INFERENCE_PRECISION_HINT": "f32"}


def import_openvino(needed_for: str) -> ModuleType:
    """The `openvino` module; UserError saying what needs it and how to install it when it is missing."""
    try:
        import openvino
    except ImportError:
        raise missing_package(needed_for, "openvino", "openvino") from None
    return openvino


def is_openvino(model: str | Path) -> bool:
    """Whether `model` names an OpenVINO IR (by its suffix; an .onnx otherwise)."""
    return Path(model).suffix.lower() == SUFFIX


def compile_ir(xml: Path, weights: Path | None = None, threads: int | None = None) -> object:
    """The IR at `xml` (weights: `weights`, default its .bin) compiled for the CPU in float32."""
    weights = weights or xml.with_suffix(".bin")
    for path in (xml, weights):
        refuse_special_file(path)
    ov = import_openvino(f"Running the OpenVINO model '{xml}'")
    core = ov.Core()
    config: dict[str, object] = dict(PRECISION)
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    model = core.read_model(str(xml), str(weights))
    return core.compile_model(model, "CPU", config)


def refuse_special_file(path: Path) -> None:
    """UserError for a FIFO, device or folder: OpenVINO would wait on a FIFO forever (images and
    checkpoints are refused the same way). A missing file is left to OpenVINO, which names it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        raise UserError(
            f"OpenVINO cannot load '{path}': it is not a regular file (a pipe, device or folder), "
            "which could block the load forever.",
            "export the checkpoint again with `python -m project export --format openvino`, and keep "
            "its .xml and .bin together as plain files.",
        )


class OpenVINOSession:
    """An IR compiled for the CPU, answering `run(output_names, {input_name: array})` like onnxruntime.

    Each thread gets its own infer request: serve runs batches from several threads at once, and
    one request must not be used by two of them.

    Args:
        model: The .xml (or a link to it, such as `latest.xml`).
        threads: CPU threads per inference (None: OpenVINO's default, all cores).
        weights: The .bin; default: the .bin of the file `model` resolves to.
    """

    def __init__(self, model: str | Path, threads: int | None = None, weights: Path | None = None) -> None:
        xml = Path(model).resolve()  # a `latest.xml` link: its weights are beside the file it points at
        try:
            self.compiled = compile_ir(xml, weights, threads)
        except UserError:
            raise
        except Exception as e:  # OpenVINO raises RuntimeError subclasses of its own for unreadable files
            raise UserError(
                f"OpenVINO cannot load '{model}': {' '.join(str(e).split())[:300]}.",
                "export the checkpoint again with `python -m project export --format openvino`, and keep "
                "its .xml and .bin together.",
            ) from None
        self._local = threading.local()

    def get_outputs(self) -> list[SimpleNamespace]:
        """The model's outputs, each with its `name`, as onnxruntime's `get_outputs` lists them."""
        return [SimpleNamespace(name=output.get_any_name()) for output in self.compiled.outputs]

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs named `output_names` for the inputs `feeds`, as numpy arrays (copies)."""
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        results = request.infer(feeds)
        return [np.array(results[self.compiled.output(name)]) for name in output_names]


Session = OpenVINOSession  # the name project.deploy.classifier.RUNTIMES opens it by
