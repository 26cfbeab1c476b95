"""Grad-CAM heat maps of predictions (`predict --explain.dir=DIR`: callbacks/grad_cam.py), for error analysis.

Which parts of an image drove the predicted class: the gradients of that class's logit weight
the activations of the network's last convolutional block, or a vision transformer's last block
(timm models: its token grid as a feature map) (pytorch-grad-cam's GradCAM). The
overlay, the image with the heat map over it, is written as `<DIR>/<image's path>.cam.png`.
Needs the `explain` extra (`pip install -e .[explain]`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from project.atomic import atomic_write
from project.backbones import family_of
from project.errors import UserError, missing_package


def target_layer(net: nn.Module, backbone: str) -> nn.Module:
    """The layer whose activations Grad-CAM weighs: the last block with a spatial feature map, as the
    backbone's family finds it (resnet's layer4, mobilenet's `features`; a timm model's last feature
    stage, or its vision transformer's last block's first norm)."""
    layer = family_of(backbone).feature_stage(net, backbone)
    if layer is None:
        raise UserError(
            f"Grad-CAM is not set up for '{backbone}': it has no convolutional feature map (a "
            "transformer's attention maps are not a convolution's feature map).",
            "explain a convolutional backbone (resnet, mobilenet, efficientnet, convnext, regnet), "
            "or leave --explain.dir unset.",
        )
    return layer


def feature_map(net: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The target layer's output as [N, C, H, W]: a vision transformer's tokens [N, T, C] without the
    class (and register) tokens, on the patch grid; a channels-last stage's [N, H, W, C] (timm's swin)."""
    prefix = int(getattr(net, "num_prefix_tokens", 0))

    def transform(output: torch.Tensor) -> torch.Tensor:
        if output.ndim == 3:
            tokens = output[:, prefix:]
            side = math.isqrt(tokens.shape[1])
            return tokens.reshape(len(tokens), side, side, -1).permute(0, 3, 1, 2)
        if getattr(net, "output_fmt", "NCHW") == "NHWC":
            return output.permute(0, 3, 1, 2)
        return output

    return transform


class Explainer:
    """Grad-CAM of a classifier (`normalize` then `net`, uint8 images in) for its predicted classes."""

    def __init__(self, normalize: nn.Module, net: nn.Module, backbone: str) -> None:
        try:
            from pytorch_grad_cam import GradCAM
        except ImportError:
            raise missing_package("--explain.dir", "explain", "grad-cam") from None
        self.model = nn.Sequential(normalize, net)
        self.cam = GradCAM(self.model, [target_layer(net, backbone)], reshape_transform=feature_map(net))

    def heat_maps(self, images: torch.Tensor) -> np.ndarray:
        """float [N, H, W] in 0..1 for uint8 images [N, 3, H, W] (the predicted class of each)."""
        with torch.inference_mode(False), torch.enable_grad():
            # predict runs in inference mode; Grad-CAM needs gradients of an ordinary tensor
            batch = images.detach().clone().float().requires_grad_(True)
            return self.cam(batch, targets=None)

    def write(self, images: torch.Tensor, names: Sequence[str], folder: Path) -> list[Path]:
        """An overlay PNG per image at folder/<name>.cam.png; returns their paths."""
        from pytorch_grad_cam.utils.image import show_cam_on_image

        maps = self.heat_maps(images)
        written = []
        for image, heat, name in zip(images, maps, names, strict=True):
            rgb = image.detach().cpu().permute(1, 2, 0).numpy().astype(np.float32) / 255
            overlay = show_cam_on_image(rgb, heat, use_rgb=True)
            path = folder / f"{name}.cam.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            buffer = _png(overlay)
            atomic_write(path, buffer)
            written.append(path)
        return written


def _png(array: np.ndarray) -> bytes:
    import io

    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()
