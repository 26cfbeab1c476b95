"""Checks of option values that their types cannot express, run before anything is trained.

Each failure is one UserError that names the option as a flag, the value given and the accepted range.
"""

from __future__ import annotations

import math
import os
from typing import Any

from project.errors import UserError

# Fewer images than this per batch at an image size: the size, not the batch, is what does not fit
MIN_BATCH = 8


def require(ok: bool, key: str, value: Any, expected: str) -> None:
    """Raise a UserError naming `--key` unless `ok`."""
    if not ok:
        raise UserError(
            f"--{key}={value!r} is out of range: it must be {expected}.", f"set --{key} to {expected}."
        )


def positive_int(key: str, value: Any) -> None:
    require(
        isinstance(value, int) and not isinstance(value, bool) and value >= 1, key, value, "an integer >= 1"
    )


def fraction(key: str, value: Any) -> None:
    """A number strictly between 0 and 1."""
    require(_number(value) and 0 < value < 1, key, value, "a number between 0 and 1 (exclusive), e.g. 0.1")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_cli_config(config: Any) -> None:
    """The options no constructor of ours sees: optimizer, schedule, Trainer, prediction writer, and the
    batch size the image size makes."""
    model = _get(config, "model")
    optimizer_args = _get(_get(model, "optimizer"), "init_args")
    lr = _get(optimizer_args, "lr")
    if lr is not None:
        require(_number(lr) and lr > 0, "model.optimizer.init_args.lr", lr, "a number > 0, e.g. 0.001")
    weight_decay = _get(optimizer_args, "weight_decay")
    if weight_decay is not None:
        key = "model.optimizer.init_args.weight_decay"
        require(_number(weight_decay) and weight_decay >= 0, key, weight_decay, "a number >= 0, e.g. 0.01")
    warmup = _get(_get(_get(model, "scheduler"), "init_args"), "warmup_steps")
    if warmup is not None:
        require(
            _integer(warmup) and warmup >= 0,
            "model.scheduler.init_args.warmup_steps",
            warmup,
            "an integer >= 0",
        )
    fraction_ = _get(_get(_get(model, "scheduler"), "init_args"), "max_warmup_fraction")
    if fraction_ is not None:
        key = "model.scheduler.init_args.max_warmup_fraction"
        require(_number(fraction_) and fraction_ >= 0, key, fraction_, "a number >= 0, e.g. 0.1")
    trainer = _get(config, "trainer") or {}
    accumulate = trainer.get("accumulate_grad_batches")
    if accumulate is not None:
        positive_int("trainer.accumulate_grad_batches", accumulate)
    max_epochs = trainer.get("max_epochs")
    if max_epochs is not None:
        require(
            isinstance(max_epochs, int) and max_epochs >= -1,
            "trainer.max_epochs",
            max_epochs,
            "-1 or an integer >= 0",
        )
    clip = trainer.get("gradient_clip_val")
    if clip is not None:
        require(
            _number(clip) and clip >= 0, "trainer.gradient_clip_val", clip, "a number >= 0 (0: no clipping)"
        )
    top_k = _get(_get(config, "predictions"), "top_k")
    if top_k is not None:
        positive_int("predictions.top_k", top_k)
    data = _get(config, "data")
    check_batch_fits(_get(data, "image_size"), _get(data, "batch_size"))


def check_batch_fits(image_size: Any, batch_size: Any, memory: int | None = None) -> None:
    """A batch whose float input alone outgrows this machine's memory (`memory` bytes, default: its RAM)
    is a typo, not a run: refuse it before any image is decoded."""
    if not (_integer(image_size) and _integer(batch_size) and image_size > 0 and batch_size > 0):
        return  # the data module names values out of range
    memory = memory or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # the RAM
    per_image = 3 * image_size**2 * 4  # float32, as the network receives it
    need = batch_size * per_image
    if need <= memory:
        return
    fitting = memory // per_image  # images of this size whose input alone fits
    sizes = (
        f"a batch of {batch_size:,} images of {image_size}x{image_size} px takes {_gib(need)} as the "
        f"network's input alone, more than this machine's {_gib(memory)} of memory."
    )
    if fitting >= MIN_BATCH:  # the size is workable: the batch is what outgrows the memory
        raise UserError(
            f"--data.batch_size={batch_size:,} is too large: {sizes}",
            f"set --data.batch_size to at most {fitting:,} at this image size, less for the model's own "
            "memory (16 to 256 are usual"
            # room: memory begin
            "; `python -m project memory` measures a batch's cost"
            # room: memory end
            ").",
        )
    raise UserError(
        f"--data.image_size={image_size} is too large: {sizes}",
        "set --data.image_size to what the images need (224 is usual"
        # room: memory begin
        "; `python -m project memory` measures a size's cost"
        # room: memory end
        "), or a smaller --data.batch_size.",
    )


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"


def _get(namespace: Any, key: str) -> Any:
    """`namespace[key]` for a jsonargparse Namespace or dict, None when absent or not a mapping."""
    return namespace.get(key) if namespace is not None and hasattr(namespace, "get") else None


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
