"""The module an export holds: uint8 images -> logits, the model's own normalization baked in."""

from __future__ import annotations

import torch
from torch import nn

from project.model import ImageClassifier


class Deployable(nn.Module):
    """uint8 images -> logits: the model's own normalization followed by the network, nothing else.

    Args:
        model: The trained classifier (its `normalize` and `net` are shared, not copied).
    """

    def __init__(self, model: ImageClassifier) -> None:
        super().__init__()
        self.normalize = model.normalize
        self.net = model.net

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(self.normalize(images))


def load_for_export(checkpoint: dict) -> ImageClassifier:
    """The classifier of a checkpoint of this project, weights loaded, in eval mode, on the CPU."""
    hp = checkpoint["hyper_parameters"]
    model = ImageClassifier(
        num_classes=hp["num_classes"],
        class_names=hp.get("class_names"),
        image_size=hp.get("image_size"),
        backbone=hp["backbone"],
        mean=tuple(hp["mean"]),
        std=tuple(hp["std"]),
        scheduler=None,
        task=hp.get("task", "multiclass"),
        threshold=hp.get("threshold", 0.5),
    )
    # torch.compile'd modules save their weights under `_orig_mod.`; the plain module has none
    state = {k.replace("_orig_mod.", ""): v for k, v in checkpoint["state_dict"].items()}
    model.load_state_dict(state)
    return model.eval()


def example_batch(size: int, batch: int = 2) -> torch.Tensor:
    """Random uint8 images [batch, 3, size, size]: what the exporters trace the model with."""
    return torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)


def dynamic_batch() -> dict:
    """torch.export's dynamic shapes of the input `images`: any batch size."""
    return {"images": {0: torch.export.Dim("batch", min=1, max=4096)}}


def export_program(model: nn.Module, size: int) -> torch.export.ExportedProgram:
    """`model` through torch.export, dynamic batch: the .pt2, and where the ONNX fallback starts."""
    return torch.export.export(model, (example_batch(size),), dynamic_shapes=dynamic_batch())
