"""torchvision's classification models as backbones (`--model.backbone=resnet18`): the default family.

Every model of `torchvision.models` by its own name, built for the configured image size, with the
weights torchvision registers for it (downloaded into torch.hub's cache, checked and read as data) or a
local file (backbones.load_weights).
"""

from __future__ import annotations

import difflib
import math
import pickle
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import torchvision
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer, interpolate_embeddings

from project.checkpoint_io import cached_weights_error, check_declared_sizes
from project.errors import UserError

PREFIX = ""  # the default family: names without a prefix
LABEL = "torchvision"
EXAMPLE = "resnet18"  # a model of the family, for its contract test (tests/test_backbones.py)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# torchvision's classification weights: ImageNet statistics, bilinear resize, 224 px centre crops of 256
TORCHVISION_PREPROCESSING = {
    "mean": IMAGENET_MEAN,
    "std": IMAGENET_STD,
    "input_size": 224,
    "interpolation": "bilinear",
    "crop_pct": 0.875,
    "tag": None,
}

# MaxViT attends within 7x7 windows at each of its stages (strides 4, 8, 16, 32): each stage's grid
# must be a whole number of windows, so 224 px (7 x 32) and its multiples fit.
MAXVIT_TILE = 224


def classification_models() -> list[str]:
    """Every torchvision classification model name (resnet18, mobilenet_v3_small, vit_b_16, ...)."""
    return torchvision.models.list_models(module=torchvision.models)


def names() -> list[str]:
    """The backbone names of this family."""
    return classification_models()


def weight_names(name: str) -> list[str]:
    """The weights `name` registers (IMAGENET1K_V1, ...), DEFAULT aside."""
    return [tag for tag in torchvision.models.get_model_weights(name).__members__ if tag != "DEFAULT"]


def build(name: str, num_classes: int, image_size: int | None) -> nn.Module:
    """torchvision's `name` with random weights and a `num_classes` head, built for `image_size` px."""
    known = classification_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"choose one of: {', '.join(known)}."
        raise UserError(f"Unknown backbone '{name}' (--model.backbone).", hint)
    extra = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
    extra |= size_arguments(name, image_size)
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes, **extra)


def preprocessing(name: str, weights: str | None = None) -> dict[str, Any]:
    """What torchvision's weights expect, the same for every model: ImageNet's statistics and crops."""
    return dict(TORCHVISION_PREPROCESSING)


def size_arguments(name: str, image_size: int | None) -> dict[str, Any]:
    """Builder arguments that size `name` for `image_size` px, or a UserError when it cannot take it.

    ViT and MaxViT fix their input size when built (torchvision builds them for 224 px unless told),
    so they are built for the configured size; swin pads its windows to any size; every other model
    takes any size from the minimum its torchvision weights document (meta["min_size"]).
    """
    if image_size is None:
        return {}
    patch_in_name = re.fullmatch(r"vit_\w+_(\d+)", name)  # vit_b_16: 16 px patches
    if patch_in_name:
        patch = int(patch_in_name.group(1))
        if image_size % patch:
            _refuse(name, image_size, f"a multiple of {patch} px", math.ceil(image_size / patch) * patch)
        return {"image_size": image_size}
    if name.startswith("maxvit_"):
        if not _maxvit_fits(image_size):
            _refuse(name, image_size, f"a multiple of {MAXVIT_TILE} px", _next_multiple(image_size))
        return {"input_size": (image_size, image_size)}
    if name.startswith("swin"):
        return {}
    minimum = min_image_size(name)
    if image_size < minimum:
        _refuse(name, image_size, f"at least {minimum} px", minimum)
    return {}


def min_image_size(name: str) -> int:
    """The smallest input torchvision documents for `name` (1 for most convolutional networks)."""
    return max(entry.meta["min_size"][0] for entry in torchvision.models.get_model_weights(name))


def _maxvit_fits(size: int) -> bool:
    # the grid of each of the 4 stages (strides 4, 8, 16, 32; rounded up) must divide into 7x7 windows
    return all(math.ceil(size / 2**k) % 7 == 0 for k in range(2, 6))


def _next_multiple(size: int) -> int:
    return max(1, math.ceil(size / MAXVIT_TILE)) * MAXVIT_TILE


def _refuse(name: str, image_size: int, needs: str, suggested: int) -> None:
    raise UserError(
        f"Backbone '{name}' cannot take {image_size} px images (--data.image_size={image_size}): "
        f"it needs {needs}.",
        f"set --data.image_size={suggested}, or choose another --model.backbone.",
    )


def adapt_state(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ViT weights made at another image size: their position embedding interpolated to this model's."""
    key = "encoder.pos_embedding"
    if not isinstance(model, VisionTransformer) or key not in state:
        return state
    if state[key].shape == model.encoder.pos_embedding.shape:
        return state
    try:
        return dict(interpolate_embeddings(model.image_size, model.patch_size, dict(state)))
    except ValueError as e:  # not a square grid of patches: not ViT weights
        raise UserError(
            f"The position embedding in the weights has shape {tuple(state[key].shape)} ({e}).",
            "pass weights saved from a torchvision vision transformer.",
        ) from None


def layer_ids(net: nn.Module) -> None:
    """torchvision's models declare no block structure: finetune cuts them into runs of parameters."""
    return None


def feature_stage(net: nn.Module, name: str) -> nn.Module | None:
    """The last top-level block with a convolution before the head (resnet's layer4; mobilenet's,
    efficientnet's and convnext's `features`), or None where the network has no such feature map (the
    transformers, whose attention maps are not a convolution's)."""
    if name.startswith(("vit_", "swin_", "maxvit")):
        return None
    from project.backbones import head_of

    head = head_of(net)
    blocks = [
        m
        for m in net.children()
        if any(isinstance(c, nn.Conv2d) and c is not head for c in m.modules()) and head not in m.modules()
    ]
    return blocks[-1] if blocks else None


def read_weights(name: str, weights: str) -> dict[str, torch.Tensor]:
    """The state dict of torchvision's registered weights `weights` (DEFAULT or a name) of `name`."""
    registry = torchvision.models.get_model_weights(name)
    try:
        entry = registry.DEFAULT if weights == "DEFAULT" else registry[weights]
    except KeyError:
        listed = ", ".join(["DEFAULT", *registry.__members__])
        raise UserError(
            f"Backbone '{name}' has no weights '{weights}' (--model.weights).",
            f"use one of: {listed}, none, or a local state-dict file.",
        ) from None
    # where torch.hub keeps the download (load_state_dict_from_url's rule)
    cache = Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(entry.url).path).name
    fix = f"delete that file (it is downloaded again from {entry.url}), or put the genuine file there."
    try:
        if not cache.is_file():  # downloaded first, so that a new file is checked as a cached one is
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(entry.url, str(cache), progress=False)
        check_declared_sizes(cache, f"the cached weights '{cache}' ({name} {weights})", fix)
        # weights-only: whatever lies in the cache folder cannot run code when it is read
        return entry.get_state_dict(progress=False, check_hash=False, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        raise cached_weights_error(cache, f"{name} {weights}", e, fix) from None
    except OSError as e:  # URLError is an OSError: no network, proxy, DNS
        raise UserError(
            f"Cannot download weights {name} {weights} from {entry.url} ({e}).",
            f"download that file on a connected machine and pass it as --model.weights={cache} "
            "(or any path), or copy it to that place so torchvision finds it.",
        ) from None
