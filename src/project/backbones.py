"""Build any torchvision classification model by name, sized for our classes, with optional weights."""

from __future__ import annotations

import difflib
from pathlib import Path

import torch
import torchvision
from torch import nn

from project.checkpoint_io import load_checkpoint_file
from project.errors import UserError


def classification_models() -> list[str]:
    """Every torchvision classification model name (resnet18, mobilenet_v3_small, vit_b_16, ...)."""
    return torchvision.models.list_models(module=torchvision.models)


def build_backbone(name: str, num_classes: int, weights: str | None = None) -> nn.Module:
    """`name` with a `num_classes` head; `weights` is None, a torchvision weights name, or a file."""
    known = classification_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"choose one of: {', '.join(known)}."
        raise UserError(f"Unknown backbone '{name}' (--model.backbone).", hint)
    extra = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes, **extra)
    if weights is not None and weights.lower() != "none":
        load_weights(model, name, weights)
    return model


def head_of(model: nn.Module) -> nn.Module:
    """The classification layer: the last Linear, or the last Conv2d where there is none (squeezenet)."""
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    layers = layers or [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    return layers[-1]


def load_weights(model: nn.Module, name: str, weights: str) -> None:
    """Load every weight but the class-specific head, from torchvision's registry or a local file."""
    state = _read_local(Path(weights)) if _looks_like_path(weights) else _read_torchvision(name, weights)
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
            "pass weights saved from the same architecture (a state dict of torchvision's "
            f"{name}), or choose the backbone they belong to.",
        )
    model.load_state_dict(compatible, strict=False)


def _looks_like_path(weights: str) -> bool:
    return "/" in weights or "\\" in weights or Path(weights).suffix in (".pth", ".pt", ".ckpt", ".bin")


def _is_aux(key: str) -> bool:
    return key.startswith(("AuxLogits.", "aux1.", "aux2."))


def _read_local(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise UserError(f"Weights file '{path}' (--model.weights) does not exist.", "check the path.")
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
    try:
        return entry.get_state_dict(progress=False, check_hash=False)
    except OSError as e:  # URLError is an OSError: no network, proxy, DNS
        cache = Path(torch.hub.get_dir()) / "checkpoints" / Path(entry.url).name
        raise UserError(
            f"Cannot download weights {name} {weights} from {entry.url} ({e}).",
            f"download that file on a connected machine and pass it as --model.weights={cache} "
            "(or any path), or copy it to that place so torchvision finds it.",
        ) from None
