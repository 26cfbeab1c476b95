"""The ONNX target: written by the TorchScript exporter or the torch.export-based one, run by onnxruntime."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from project.deploy.outputs import Outputs
from project.export.deployable import OUTPUTS, dynamic_batch, example_batch

if TYPE_CHECKING:
    from project.export.target import Files, Runner, Source


def torchscript(source: Source, files: Files) -> bool:
    """The TorchScript exporter, tried first.

    It writes the file in 0.3-0.4 s where the torch.export-based one takes 2.9-8.2 s, most of it
    decomposing the program again (resnet18, mobilenet_v3_small; `bench/onnx_exporters.py`);
    onnxruntime runs the two graphs within 5% of each other but for one case (resnet18 32 px,
    batch 1: 16% slower). It is deprecated in torch, so any failure of it, or a file that fails
    verification, falls back to `torch_export`.
    """
    return write_torchscript(source.model, source.size, files["onnx"], source.opset)


def torch_export(source: Source, files: Files) -> bool:
    """The torch.export-based exporter, starting from the program the .pt2 holds."""
    write_torch_export(source.program, source.size, files["onnx"], source.opset)
    return True


def write_torchscript(model: nn.Module, size: int, path: Path, opset: int) -> bool:
    """The TorchScript exporter's file at `path`, dynamic batch; False where it cannot export `model`."""
    outputs = output_names(model)
    try:
        with warnings.catch_warnings():
            # its deprecation notice and tracer warnings: the file is verified instead
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (example_batch(size),),
                str(path),
                input_names=["images"],
                output_names=outputs,
                dynamic_axes={name: {0: "batch"} for name in ["images", *outputs]},
                opset_version=opset,
                dynamo=False,
            )
    except Exception:  # an operator it cannot convert, or a torch without it: the other exporter
        return False
    return True


def write_torch_export(program: torch.export.ExportedProgram, size: int, path: Path, opset: int) -> None:
    """The torch.export-based exporter's file at `path` (dynamic batch, no external data); its outputs
    named as `Deployable.outputs` names them, as many as the program has."""
    outputs = OUTPUTS[: len(program.graph_signature.user_outputs)]
    torch.onnx.export(
        program,
        (example_batch(size),),
        str(path),
        input_names=["images"],
        output_names=outputs,
        dynamic_shapes=dynamic_batch(),
        opset_version=opset,
        external_data=False,
        dynamo=True,
        verbose=False,
    )


def output_names(model: nn.Module) -> list[str]:
    """The graph's outputs: `Deployable.outputs` (logits, and the features where the network has them)."""
    return list(getattr(model, "outputs", OUTPUTS[:1]))


def load(files: Files) -> Runner:
    """An onnxruntime session (CPU) on the file, as infer and serve run it."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(files["onnx"]), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]

    def run(images: np.ndarray) -> Outputs:
        return Outputs.of(names, session.run(names, {"images": images}))

    return run
