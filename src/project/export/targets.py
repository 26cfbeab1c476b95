"""The export targets, in one table: how each is written, and loaded to run (so verified).

`export` writes the targets of TARGETS next to the checkpoint (`<run>-<metric>-<time>.<suffix>`):
every one that is not optional, plus the optional one `--format` names (FORMATS, derived from this
table, are `--format`'s values). Each is verified against the PyTorch model on the same images
(`project.export.verify`) and named in the sidecar's `files`. A new target is a module with its writers
and its loader (the types are project.export.target's) and one row here (docs/new-task.md, "an export
target").
"""

from __future__ import annotations

from project.export import (
    onnx_target,
    openvino_target,  # room: openvino
    pt2_target,
)
from project.export.target import Files, Runner, Source, Target, Writer

__all__ = ["FORMATS", "TARGETS", "Files", "Runner", "Source", "Target", "Writer", "chosen"]

TARGETS: dict[str, Target] = {
    target.name: target
    for target in (
        Target(
            "onnx",
            "onnxruntime",
            {"torchscript": onnx_target.torchscript, "torch.export": onnx_target.torch_export},
            onnx_target.load,
        ),
        Target("pt2", "pt2", {"torch.export": pt2_target.write}, pt2_target.load),
        # room: openvino begin
        Target(
            "openvino",
            "openvino",
            {"openvino.convert_model": openvino_target.convert},
            openvino_target.load,
            suffixes=openvino_target.SUFFIXES,
            optional=True,
            require=openvino_target.require,
            version=openvino_target.version,
            fix="export without --format openvino (ONNX only), or try another openvino release.",
        ),
        # room: openvino end
    )
}


# --format: "onnx" (the targets written with every export: ONNX and .pt2), or an optional target's name
FORMATS = ("onnx", *(name for name, target in TARGETS.items() if target.optional))


def chosen(format: str) -> list[Target]:
    """The targets an export with `--format format` writes, in TARGETS' order."""
    return [target for target in TARGETS.values() if not target.optional or target.name == format]
