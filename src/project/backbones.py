"""Build any torchvision classification model (or timm model, `timm/<name>`) by name, sized for our
classes, with optional weights."""

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

from project import timm_backbones
from project.checkpoint_io import cached_weights_error, check_declared_sizes, load_checkpoint_file
from project.errors import UserError

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


def build_backbone(
    name: str, num_classes: int, weights: str | None = None, image_size: int | None = None
) -> nn.Module:
    """`name` with a `num_classes` head, built for `image_size` px inputs (None: the model's own size);
    `weights` is None, a weights name (torchvision's, or DEFAULT/a tag for `timm/` names), or a file."""
    if timm_backbones.is_timm(name):
        model = timm_backbones.build(name, num_classes, image_size)
        if weights is not None and weights.lower() != "none":
            load_weights(model, name, weights)
        return model
    known = classification_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"choose one of: {', '.join(known)}."
        raise UserError(f"Unknown backbone '{name}' (--model.backbone).", hint)
    extra = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
    extra |= size_arguments(name, image_size)
    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes, **extra)
    if weights is not None and weights.lower() != "none":
        load_weights(model, name, weights)
    return model


def preprocessing(name: str, weights: str | None = None) -> dict[str, Any]:
    """What backbone `name`'s pretrained weights expect: mean, std, input_size, interpolation, crop_pct
    (timm: the model's pretrained config for that weights tag; torchvision: ImageNet's, for every model)."""
    if timm_backbones.is_timm(name):
        return timm_backbones.pretrained_config(name, weights)
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


def head_of(model: nn.Module) -> nn.Module:
    """The classification layer: timm's classifier, else the last Linear, or the last Conv2d where there is
    none (squeezenet)."""
    if hasattr(model, "get_classifier"):
        return model.get_classifier()
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    layers = layers or [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    return layers[-1]


def feature_layer(model: nn.Module) -> nn.Linear | None:
    """The classification layer when it is a Linear, whose input is then the penultimate features (what the
    feature-space `unknown` score compares); None where it is not (squeezenet's convolution)."""
    head = head_of(model)
    return head if isinstance(head, nn.Linear) else None


def logits_and_features(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits, penultimate features [N, D]) of `model` on the normalized batch `x`; features None where
    `feature_layer` finds no Linear head or it does not run exactly once."""
    layer = feature_layer(model)
    if layer is None:
        return model(x), None
    captured: list[torch.Tensor] = []
    handle = layer.register_forward_pre_hook(lambda module, inputs: captured.append(inputs[0]))
    try:
        logits = model(x)
    finally:
        handle.remove()
    if len(captured) != 1:
        return logits, None
    return logits, captured[0].flatten(1)


def load_weights(model: nn.Module, name: str, weights: str) -> None:
    """Load every weight but the class-specific head, from torchvision's registry, timm's hub or a local
    file."""
    if _looks_like_path(weights):
        state = _read_local(Path(weights))
    elif timm_backbones.is_timm(name):
        state, _ = timm_backbones.read_hub(name, weights)
    else:
        state = _read_torchvision(name, weights)
    if timm_backbones.is_timm(name):
        state = timm_backbones.adapt_state(model, state)
    state = _fit_position_embedding(model, state)
    own = model.state_dict()
    head = head_of(model)
    head_keys = {f"{k}.{p}" for k, m in model.named_modules() if m is head for p in ("weight", "bias")}
    compatible = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    skipped = sorted(k for k in state if k not in compatible)
    missing = sorted(set(own) - set(compatible) - head_keys)
    if missing or [k for k in skipped if k not in head_keys and not _is_aux(k)]:
        raise UserError(
            f"Weights '{weights}' do not fit backbone '{name}': {len(missing)} of its tensors are missing "
            f"(e.g. {missing[:3]}), {len(skipped)} in the file do not match (e.g. {skipped[:3]}).",
            "pass weights saved from the same architecture (a state dict of "
            f"{'timm' if timm_backbones.is_timm(name) else 'torchvision'}'s {name}), or choose the "
            "backbone they belong to.",
        )
    model.load_state_dict(compatible, strict=False)


def _fit_position_embedding(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ViT weights made at another image size: interpolate their position embedding to this model's."""
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


def _looks_like_path(weights: str) -> bool:
    suffixes = (".pth", ".pt", ".ckpt", ".bin", ".safetensors")
    return "/" in weights or "\\" in weights or Path(weights).suffix in suffixes


def _is_aux(key: str) -> bool:
    return key.startswith(("AuxLogits.", "aux1.", "aux2."))


def _read_local(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise UserError(f"Weights file '{path}' (--model.weights) does not exist.", "check the path.")
    if path.suffix == ".safetensors":  # tensors only, by the format
        state = timm_backbones.read_safetensors(path)
    else:
        state = load_checkpoint_file(path)  # weights-only: a file from elsewhere cannot run code
    for key in ("state_dict", "model"):  # Lightning checkpoints and common training scripts nest it
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise UserError(
            f"Weights file '{path}' holds no state dict.", "save it with torch.save(model.state_dict())."
        )
    # A checkpoint of this project stores the backbone under `net.`: strip it so both kinds load.
    return {k.removeprefix("net."): v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _read_torchvision(name: str, weights: str) -> dict[str, torch.Tensor]:
    registry = torchvision.models.get_model_weights(name)
    try:
        entry = registry.DEFAULT if weights == "DEFAULT" else registry[weights]
    except KeyError:
        names = ", ".join(["DEFAULT", *registry.__members__])
        raise UserError(
            f"Backbone '{name}' has no weights '{weights}' (--model.weights).",
            f"use one of: {names}, none, or a local state-dict file.",
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
