"""Build a backbone by name, sized for our classes, with optional weights, whichever family it is from.

A family is a module that builds its models by name (`FAMILIES`: torchvision's by default, timm's as
`timm/<name>`), reads its registered weights, says what preprocessing they expect and how its layers are
ordered in depth. What every family shares is here: the head, the penultimate features, weights from a
local file, and the check that weights fit the model they are loaded into.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from project.checkpoint_io import load_checkpoint_file
from project.errors import UserError, install_hint

# The backbone families: a `--model.backbone` prefix -> the module of that family's models, imported when a
# name with its prefix is used (so a family's packages are needed by its models only). The first prefix a
# name starts with wins; torchvision's, with none, is the default. A family module gives:
#   PREFIX, LABEL (its name in messages), EXAMPLE (one small model, for the contract test over this table)
#   names() -> every backbone name; weight_names(name) -> its registered weights, DEFAULT aside
#   build(name, num_classes, image_size) -> the model with random weights (UserError for a name it lacks)
#   preprocessing(name, weights) -> mean, std, input_size, interpolation, crop_pct, tag of those weights
#   read_weights(name, weights) -> the state dict of registered weights (DEFAULT or a name)
#   adapt_state(model, state) -> weights of another input size or layout made to fit the model
#   layer_ids(net) -> each parameter's depth in the model's own blocks, or None (finetune cuts runs)
#   feature_stage(net, name) -> the last block with a spatial feature map, or None (Grad-CAM's layer)
FAMILIES = {
    # room: timm begin
    "timm/": "project.timm_backbones",
    # room: timm end
    "": "project.torchvision_backbones",
}


def family_of(name: str) -> ModuleType:
    """The family module of backbone `name` (its prefix's row of FAMILIES)."""
    prefix = next(prefix for prefix in FAMILIES if name.startswith(prefix))
    return importlib.import_module(FAMILIES[prefix])


def build_backbone(
    name: str, num_classes: int, weights: str | None = None, image_size: int | None = None
) -> nn.Module:
    """`name` with a `num_classes` head, built for `image_size` px inputs (None: the model's own size);
    `weights` is None, a weights name of the family (DEFAULT, torchvision's IMAGENET1K_V1, a timm tag) or
    a file."""
    model = family_of(name).build(name, num_classes, image_size)
    if weights is not None and weights.lower() != "none":
        load_weights(model, name, weights)
    return model


def preprocessing(name: str, weights: str | None = None) -> dict[str, Any]:
    """What backbone `name`'s pretrained weights expect: mean, std, input_size, interpolation, crop_pct
    (torchvision: ImageNet's, for every model; timm: the model's pretrained config for that weights tag)."""
    return family_of(name).preprocessing(name, weights)


def head_of(model: nn.Module) -> nn.Module:
    """The classification layer: timm's classifier, else the last Linear, or the last Conv2d where there is
    none (squeezenet)."""
    if hasattr(model, "get_classifier"):
        return model.get_classifier()
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    layers = layers or [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    return layers[-1]


def freeze_backbone(net: nn.Module, frozen: bool) -> None:
    """Stop (or restart) gradients to every parameter but the head's."""
    net.requires_grad_(not frozen)
    head_of(net).requires_grad_(True)


def fix_batchnorm(net: nn.Module) -> None:
    """Put the backbone's BatchNorm layers in eval mode: a frozen backbone keeps its running statistics."""
    head = head_of(net)
    for module in net.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module is not head:
            module.eval()


def feature_layer(model: nn.Module) -> nn.Linear | None:
    """The classification layer when it is a Linear, whose input is then the penultimate features (an
    export's second output); None where it is not (squeezenet's convolution)."""
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
    """Load every weight but the class-specific head, from the family's registered weights or a local
    file."""
    family = family_of(name)
    state = _read_local(Path(weights)) if _looks_like_path(weights) else family.read_weights(name, weights)
    state = family.adapt_state(model, state)
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
            f"pass weights saved from the same architecture (a state dict of {family.LABEL}'s {name}), or "
            "choose the backbone they belong to.",
        )
    model.load_state_dict(compatible, strict=False)


def _looks_like_path(weights: str) -> bool:
    suffixes = (".pth", ".pt", ".ckpt", ".bin", ".safetensors")
    return "/" in weights or "\\" in weights or Path(weights).suffix in suffixes


def _is_aux(key: str) -> bool:
    return key.startswith(("AuxLogits.", "aux1.", "aux2."))


def _read_local(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise UserError(f"Weights file '{path}' (--model.weights) does not exist.", "check the path.")
    # safetensors hold tensors only, by the format; other files are read weights-only: neither runs code
    state = read_safetensors(path) if path.suffix == ".safetensors" else load_checkpoint_file(path)
    for key in ("state_dict", "model"):  # Lightning checkpoints and common training scripts nest it
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise UserError(
            f"Weights file '{path}' holds no state dict.", "save it with torch.save(model.state_dict())."
        )
    # A checkpoint of this project stores the backbone under `net.`: strip it so both kinds load.
    return {k.removeprefix("net."): v for k, v in state.items() if isinstance(v, torch.Tensor)}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors file (a format that holds tensors only), or a UserError naming it."""
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError:  # an environment installed before safetensors was a dependency
        raise UserError(
            f"Weights file '{path}' is a .safetensors file: reading it needs the safetensors package, which "
            "is not installed.",
            install_hint(None, "safetensors") + ": the project depends on it.",
        ) from None
    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(
            f"Cannot read weights file '{path}': {str(e).splitlines()[0]}.",
            "the file is truncated or not a safetensors file; download it again.",
        ) from None
