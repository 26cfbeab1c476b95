"""The module an export holds: uint8 images -> logits and features, the model's own normalization baked in."""

from __future__ import annotations

import torch
from torch import nn

from project.backbones import feature_layer, logits_and_features, preprocessing
from project.model import ImageClassifier

OUTPUTS = ["logits", "features"]  # what the exported graphs name their outputs, in order


class Deployable(nn.Module):
    """uint8 images -> (logits, features): the model's own normalization followed by the network.

    The features are the network's penultimate ones (the input of its classification layer): what an
    image looks like to the network, beside what it answers.
    The `unknown` score compares them with the training images' (`feature_bank`).  # room: unknown
    A network whose classification layer is not a Linear has none: then, and with `features=False`,
    the output is the logits alone.

    Args:
        model: The trained classifier (its `normalize` and `net` are shared, not copied).
        features: Output the features too, where the network has them.
    """

    def __init__(self, model: ImageClassifier, features: bool = True) -> None:
        super().__init__()
        self.normalize = model.normalize
        self.net = model.net
        self.features = features and feature_layer(model.net) is not None

    @property
    def outputs(self) -> list[str]:
        """The names of the outputs, in order: what the exported graphs call them."""
        return OUTPUTS if self.features else OUTPUTS[:1]

    def forward(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x = self.normalize(images)
        if not self.features:
            return self.net(x)
        logits, features = logits_and_features(self.net, x)
        if features is None:  # its classification layer ran more than once: no one set of features
            raise RuntimeError("the network's classification layer did not run exactly once")
        return logits, features

    def run(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits, features or None) of uint8 `images`, whatever the outputs."""
        out = self(images)
        return out if isinstance(out, tuple) else (out, None)


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
        # room: multilabel begin
        task=hp.get("task", "multiclass"),
        threshold=hp.get("threshold", 0.5),
        # room: multilabel end
    )
    # torch.compile'd modules save their weights under `_orig_mod.`; the plain module has none
    state = {k.replace("_orig_mod.", ""): v for k, v in checkpoint["state_dict"].items()}
    model.load_state_dict(state)
    # built without weights (the state dict has them): the config of the weights it was trained from
    model.pretrained_config = preprocessing(hp["backbone"], hp.get("weights"))
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
