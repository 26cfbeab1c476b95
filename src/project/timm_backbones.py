"""timm models as backbones (`--model.backbone=timm/<name>`): a family of backbones.FAMILIES.

It builds them, gives their pretrained configs, reads their weights from the Hugging Face hub, and orders
their layers in depth by timm's own blocks. timm is optional (`pip install -e '.[timm]'`): this module
is imported only when a `timm/` name is used. Hub
weights are read as data: the hub's `model.safetensors` (tensors only), or where a model has none its
`pytorch_model.bin` through torch.load(weights_only=True), so a file planted in the cache runs nothing
(and, as every torch file the project loads, only after its declared sizes are checked against its length).
"""

from __future__ import annotations

import difflib
import pickle
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from project.backbones import read_safetensors
from project.checkpoint_io import cached_weights_error, check_declared_sizes
from project.errors import UserError, missing_package

PREFIX = "timm/"
LABEL = "timm"
EXAMPLE = "timm/test_resnet"  # timm's own tiny ResNet, for the family's contract test
HUB_FILES = ("model.safetensors", "pytorch_model.bin")  # the hub's weights files, data-only first


def timm_module() -> ModuleType:
    """The timm package, or a UserError saying how to install it."""
    try:
        import timm
    except ImportError:
        raise missing_package("timm backbones (--model.backbone=timm/...)", "timm", "timm") from None
    return timm


def names() -> list[str]:
    """Every timm architecture as a backbone name (timm/resnet18, timm/convnext_nano, ...)."""
    return [PREFIX + name for name in timm_module().list_models()]


def weight_names(name: str) -> list[str]:
    """The pretrained weight tags of timm backbone `name` (in12k_ft_in1k, ...), timm's default first."""
    timm = timm_module()
    arch = architecture(name)
    tags = [n.split(".", 1)[1] for n in timm.list_models(arch, pretrained=True) if "." in n]
    default = timm.models.get_pretrained_cfg(arch)
    first = [default.tag] if default is not None and default.tag in tags else []
    return first + [t for t in tags if t not in first]


def architecture(name: str) -> str:
    """`timm/convnext_nano` -> `convnext_nano`, checked against timm's registry (close-match hint)."""
    timm = timm_module()
    arch = name.removeprefix(PREFIX)
    if "." in arch:  # timm's `arch.tag` form: the tag is a weights choice, which has its own option
        base, tag = arch.split(".", 1)
        raise UserError(
            f"Backbone '{name}' names weights ('.{tag}') in --model.backbone.",
            f"pass --model.backbone={PREFIX}{base} --model.weights={tag}.",
        )
    if not timm.is_model(arch):
        known = timm.list_models()
        close = difflib.get_close_matches(arch, known, n=3)
        every = "timm.list_models() names them all."
        # room: models begin
        every = "list them with `python -m project models timm/PATTERN`."
        # room: models end
        hint = f"did you mean {', '.join(PREFIX + c for c in close)}?" if close else every
        raise UserError(f"Unknown backbone '{name}' (--model.backbone).", hint)
    return arch


def preprocessing(name: str, weights: str | None = None) -> dict[str, Any]:
    """The preprocessing timm's pretrained config gives backbone `name` with weights `weights` (a tag;
    DEFAULT, none or a file: timm's default tag): mean, std, input_size, interpolation, crop_pct."""
    arch = architecture(name)
    tag = weights if weights and weights in weight_names(name) else None
    cfg = timm_module().models.get_pretrained_cfg(f"{arch}.{tag}" if tag else arch)
    if cfg is None:  # an architecture without any pretrained config: timm's generic defaults
        return {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225), "input_size": 224,
                "interpolation": "bilinear", "crop_pct": 0.875, "tag": None}  # fmt: skip
    return {
        "mean": tuple(float(v) for v in cfg.mean),
        "std": tuple(float(v) for v in cfg.std),
        "input_size": int(cfg.input_size[-1]),
        "interpolation": str(cfg.interpolation),
        "crop_pct": float(cfg.crop_pct),
        "tag": cfg.tag,
    }


def build(name: str, num_classes: int, image_size: int | None) -> nn.Module:
    """timm backbone `name` with random weights and a `num_classes` head, for `image_size` px inputs
    (models that fix their input size when built, such as ViTs, are built for it)."""
    timm = timm_module()
    arch = architecture(name)
    cfg = timm.models.get_pretrained_cfg(arch)
    sized = {"img_size": image_size} if image_size and cfg is not None and cfg.fixed_input_size else {}
    try:
        model = timm.create_model(arch, pretrained=False, num_classes=num_classes, **sized)
    except (AssertionError, ValueError, TypeError, RuntimeError) as e:
        raise UserError(
            f"Backbone '{name}' cannot be built{f' for {image_size} px images' if image_size else ''}: "
            f"{str(e).splitlines()[0]}.",
            "choose another --data.image_size (the model's pretrained size is "
            f"{preprocessing(name)['input_size']} px) or another --model.backbone.",
        ) from None
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    if image_size and patch and image_size % patch[0]:
        size = -(-image_size // patch[0]) * patch[0]
        raise UserError(
            f"Backbone '{name}' cannot take {image_size} px images (--data.image_size={image_size}): "
            f"it needs a multiple of {patch[0]} px.",
            f"set --data.image_size={size}, or choose another --model.backbone.",
        )
    return model


def adapt_state(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights made for another input size or in an original repository's layout, made to fit `model`
    by the filter timm applies to its own pretrained weights (e.g. a ViT's position embedding resampled
    to this model's grid). timm keeps that filter as `checkpoint_filter_fn` in the model's module."""
    adapt = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
    if adapt is None:
        return state
    try:
        return dict(adapt(dict(state), model))
    except (KeyError, ValueError, RuntimeError, AssertionError):
        return state  # not this layout: load_weights names what does not fit


def read_weights(name: str, weights: str) -> dict[str, torch.Tensor]:
    """The state dict of pretrained weights `weights` (DEFAULT or a tag) of `name` from the Hugging Face
    hub (or its local cache)."""
    arch = architecture(name)
    tags = weight_names(name)
    if weights != "DEFAULT" and weights not in tags:
        listed = ", ".join(["DEFAULT", *tags]) if tags else "none (it has no pretrained weights)"
        raise UserError(
            f"Backbone '{name}' has no weights '{weights}' (--model.weights).",
            f"use one of: {listed}, none, or a local .safetensors/.pth file.",
        )
    if not tags:
        raise UserError(
            f"Backbone '{name}' has no pretrained weights in timm (--model.weights={weights}).",
            "use --model.weights=none, or a local .safetensors/.pth file.",
        )
    # tags[0] is timm's default tag: weight_names puts it first
    cfg = timm_module().models.get_pretrained_cfg(f"{arch}.{tags[0] if weights == 'DEFAULT' else weights}")
    label = f"{arch}.{cfg.tag}"
    if not cfg.hf_hub_id:
        raise UserError(
            f"The weights {label} are not on the Hugging Face hub (timm lists {cfg.url or 'no file'}).",
            "download them and pass the file as --model.weights=PATH.",
        )
    return _download(cfg.hf_hub_id, label)


def _download(repo: str, label: str) -> dict[str, torch.Tensor]:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    first = HUB_FILES[0]
    url = f"{constants.ENDPOINT}/{repo}/resolve/main/{first}"
    for file in HUB_FILES:
        try:
            path = Path(hf_hub_download(repo, file))
        except (LocalEntryNotFoundError, EntryNotFoundError):  # offline and not cached, or no such file
            continue
        except OSError as e:  # proxy, TLS, HTTP errors
            raise UserError(
                f"Cannot download the timm weights {label} ({url}): {str(e).splitlines()[0]}.",
                f"download {first} from that address on a connected machine and pass it as "
                "--model.weights=PATH.",
            ) from None
        if file.endswith(".safetensors"):  # its header's offsets are checked against the file's length
            return read_safetensors(path)
        fix = "delete that file (it is downloaded again), or put the genuine file there."
        check_declared_sizes(path, f"the cached weights '{path}' ({label})", fix)
        try:  # weights-only: whatever lies in the cache folder cannot run code when it is read
            return torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
            raise cached_weights_error(path, label, e, fix) from None
    raise UserError(
        f"Cannot download the timm weights {label} from {url}: this machine is offline (or the hub is "
        f"unreachable) and they are not in the Hugging Face cache ({constants.HF_HUB_CACHE}).",
        f"download {first} from that address on a connected machine and pass it as "
        f"--model.weights=PATH/{first} (or run `hf download {repo}` there and copy "
        f"{constants.HF_HUB_CACHE}/models--{repo.replace('/', '--')} to the same place here).",
    )


def layer_ids(net: nn.Module) -> dict[str, int] | None:
    """Each parameter's depth in the model's own block structure (timm's `group_matcher`: stem 0, each
    block or stage next, the head last), or None for a model without one."""
    if not hasattr(net, "group_matcher"):
        return None
    from timm.models import group_parameters

    return group_parameters(net, net.group_matcher(coarse=False), reverse=True)


def feature_stage(net: nn.Module, name: str) -> nn.Module:
    """The last feature stage the model declares (`feature_info`), or for a vision transformer its last
    block's first norm (where the class token's gradient still reaches every patch token: after it, only
    the class token does)."""
    blocks = getattr(net, "blocks", None)
    if hasattr(net, "patch_embed") and blocks is not None and hasattr(blocks[-1], "norm1"):
        return blocks[-1].norm1
    return net.get_submodule(net.feature_info[-1]["module"])
