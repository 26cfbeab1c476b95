"""What the commands take from a checkpoint: its model and data settings, validated as plain data.

A checkpoint's `hyper_parameters` are what `fit` was configured with. LightningCLI would merge them
into the parsed config as they are, and jsonargparse instantiates any `class_path` it finds there, so
a checkpoint that passes the weights-only load could still import a module or call a function of the
attacker's choice. Here every value is checked before the parser sees it:

- only the options of `ImageClassifier` and `ImageDataModule` are read, others are ignored;
- a value is None, a bool, a number, a string, or a list of those: never a mapping;
- the backbone is a name: `backbones.build_backbone` builds only the models it knows;
- the optimizer and scheduler (needed to resume `fit` only) name a class from a fixed allow-list
  (torch.optim, torch.optim.lr_scheduler, project.schedulers) with plain init args;
- `weights` is never taken: the checkpoint's own tensors replace whatever weights a model starts with.

The result is a config layer that sits between configs/default.yaml and the user's own `--config`
files and flags, so a flag on the command line still overrides what the checkpoint says.
"""

from __future__ import annotations

import inspect
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any

import torch
from packaging.version import InvalidVersion, Version

from project.checkpoint_io import load_checkpoint_file
from project.errors import UserError

# Options that describe the machine or the invocation rather than the run: never taken from a file.
_NOT_TAKEN = {"weights", "predict_dir", "num_workers", "prefetch_factor"}
# the key Lightning reads first from every checkpoint it restores (to migrate older formats)
VERSION_KEY = "pytorch-lightning_version"
# Deep enough for every option of ours (mean, scale: a list of numbers); deeper means not ours.
_MAX_DEPTH = 2


def checkpoint_layer(ckpt_path: str | Path, subcommand: str) -> dict[str, Any]:
    """The model and data settings a checkpoint was trained with, as a config.

    `fit --ckpt_path` resumes: the model must be the one saved, with its optimizer and schedule, and
    it goes on with the run's own data. validate, test, predict and export evaluate the run: its data
    settings (root, split, image size, crop) make a bare `validate --ckpt_path X` reproduce the run's
    own validation. Flags on the command line override both.
    """
    checkpoint = load_checkpoint_file(ckpt_path)
    check_lightning_keys(ckpt_path, checkpoint)
    hparams = checkpoint.get("hyper_parameters") or {}
    if not isinstance(hparams, dict):
        raise _refused(ckpt_path, "hyper_parameters", hparams, "a mapping of option names to values")
    layer: dict[str, Any] = {"model": model_values(ckpt_path, hparams, resume=subcommand == "fit")}
    data = checkpoint.get("datamodule_hyper_parameters") or {}
    if not isinstance(data, dict):
        raise _refused(ckpt_path, "datamodule_hyper_parameters", data, "a mapping")
    from project.data.datamodule import DEFAULT_INTERPOLATION

    layer["data"] = data_values(ckpt_path, data)
    # a checkpoint from before --data.interpolation was trained with the one filter there was
    layer["data"].setdefault("interpolation", DEFAULT_INTERPOLATION)
    if "image_size" in layer["model"]:  # linked to the model, stored there only
        layer["data"]["image_size"] = layer["model"]["image_size"]
    return layer


def check_lightning_keys(ckpt_path: str | Path, checkpoint: Any) -> None:
    """The keys Lightning reads from a checkpoint without a check (a KeyError or InvalidVersion from
    deep inside it otherwise): a mapping, with a version string and a state dict."""
    if not isinstance(checkpoint, dict):
        raise _refused(ckpt_path, "(the whole file)", type(checkpoint).__name__, "a mapping")
    version = checkpoint.get(VERSION_KEY)
    try:
        Version(version if isinstance(version, str) else "")
    except InvalidVersion:
        raise _refused(
            ckpt_path,
            VERSION_KEY,
            version,
            "the version of Lightning that wrote it, such as '2.6.0'",
            "pass a checkpoint written by `fit` (checkpoints/<run>/); a file of weights alone goes to "
            "--model.weights.",
        ) from None
    if not isinstance(checkpoint.get("state_dict"), dict):
        raise _refused(
            ckpt_path, "state_dict", checkpoint.get("state_dict"), "a mapping of tensor names to tensors"
        )


def model_values(ckpt_path: str | Path, hparams: dict, resume: bool) -> dict[str, Any]:
    """The model options in `hparams` that are safe to parse; the optimizer and schedule when resuming."""
    from project.model import ImageClassifier

    values = {key: _plain(ckpt_path, key, hparams[key]) for key in _options(ImageClassifier) & hparams.keys()}
    for key in ("optimizer", "scheduler"):
        if resume and hparams.get(key) is not None:
            values[key] = _allowed_class(ckpt_path, key, hparams[key])
    return values


def data_values(ckpt_path: str | Path, hparams: dict) -> dict[str, Any]:
    """The data options in `hparams`, each a plain value."""
    from project.data.datamodule import ImageDataModule

    return {key: _plain(ckpt_path, key, hparams[key]) for key in _options(ImageDataModule) & hparams.keys()}


@cache
def _options(cls: type) -> frozenset[str]:
    """The init arguments of `cls` whose type is plain data: a string there can never name a class."""
    hints = typing.get_type_hints(cls.__init__)
    names = inspect.signature(cls.__init__).parameters.keys() - {"self"} - _NOT_TAKEN
    return frozenset(name for name in names if _is_plain_type(hints.get(name)))


def _is_plain_type(tp: Any) -> bool:
    if tp in (type(None), bool, int, float, str):
        return True
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return True
    if origin in (list, tuple, typing.Union, types.UnionType):
        return all(arg is Ellipsis or _is_plain_type(arg) for arg in typing.get_args(tp))
    return False


def _plain(ckpt_path: str | Path, key: str, value: Any, depth: int = 0) -> Any:
    """`value` if it is None, a bool, a number, a string or a (shallow) list of them; else refused."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple) and depth < _MAX_DEPTH:
        return [_plain(ckpt_path, key, v, depth + 1) for v in value]
    raise _refused(ckpt_path, key, value, "a plain value (number, text, true/false or a list of them)")


@cache
def allowed_classes() -> frozenset[str]:
    """Optimizer and schedule classes a checkpoint may name: torch's own and this project's."""
    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler

    from project import schedulers

    found = set()
    for module, base in (
        (torch.optim, Optimizer),
        (torch.optim.lr_scheduler, LRScheduler),
        (schedulers, LRScheduler),
    ):
        for name, obj in vars(module).items():
            if (
                not name.startswith("_")
                and isinstance(obj, type)
                and issubclass(obj, base)
                and obj is not base
                and obj.__module__.startswith(module.__name__)  # defined there, not re-exported
            ):
                found.add(f"{module.__name__}.{name}")
    return frozenset(found)


def _allowed_class(ckpt_path: str | Path, key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("class_path"), str):
        raise _refused(ckpt_path, key, value, "{class_path: ..., init_args: {...}}")
    class_path = value["class_path"]
    if class_path not in allowed_classes():
        raise _refused(
            ckpt_path,
            f"{key}.class_path",
            class_path,
            "a class of torch.optim, torch.optim.lr_scheduler or project.schedulers",
            fix=f"pass the run's own --config (or --model.{key}=...) on the command line to resume it",
        )
    init_args = value.get("init_args") or {}
    if not isinstance(init_args, dict):
        raise _refused(ckpt_path, f"{key}.init_args", init_args, "a mapping of argument names to values")
    args = {str(k): _plain(ckpt_path, f"{key}.init_args.{k}", v) for k, v in init_args.items()}
    return {"class_path": class_path, "init_args": args}


def _refused(ckpt_path: str | Path, key: str, value: Any, expected: str, fix: str | None = None) -> UserError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return UserError(
        f"Refused checkpoint '{ckpt_path}': its setting '{key}' is {shown}, expected {expected}. "
        "Nothing from it was imported or run.",
        fix or "use a checkpoint written by this project's `fit`, from a source you trust.",
    )
