"""Checks of option values that their types cannot express, run before anything is trained.

Each failure is one UserError that names the option as a flag, the value given and the accepted range.
"""

from __future__ import annotations

import math
from typing import Any

from project.errors import UserError


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
    """The options no constructor of ours sees: the optimizer's learning rate and the Trainer's."""
    optimizer = config.get("model", {}).get("optimizer") if hasattr(config, "get") else None
    init_args = getattr(optimizer, "init_args", None) if optimizer is not None else None
    lr = init_args.get("lr") if init_args is not None and hasattr(init_args, "get") else None
    if lr is not None:
        require(_number(lr) and lr > 0, "model.optimizer.init_args.lr", lr, "a number > 0, e.g. 0.001")
    trainer = config.get("trainer") or {}
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
