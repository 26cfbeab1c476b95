"""fit's own options, as the sweep checks against them: the searched names before any trial, and a
stored trial's parameters before its config is written as best.yaml."""

from __future__ import annotations

import difflib
import io
import math
from contextlib import redirect_stdout
from typing import Any

import optuna
import yaml

from project.errors import UserError
from project.sweep.settings import Command, Sweep, run_name


def fit_options(fit_args: list[str]) -> dict[str, Any]:
    """The resolved config fit would run with these arguments (`fit --print_config`), parsed here.

    A mistake in the fit options is reported by fit's own parser now, before any trial starts.
    """
    from project.cli import main as fit_main

    out = io.StringIO()
    try:
        with redirect_stdout(out):
            fit_main(["fit", *fit_args, "--print_config"])
    except SystemExit as e:
        if e.code not in (0, None):
            raise  # fit's parser already said what is wrong
    return yaml.safe_load(out.getvalue()) or {}


def check_space_keys(command: Command, options: dict[str, Any]) -> None:
    """Every searched option is one of fit's, and no fit flag also sets it."""
    known = sorted(_dotted(options))
    for key in command.sweep.space:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.7)
            hint = f"did you mean '{close[0]}'?" if close else "use a key that `fit --print_config` shows."
            raise UserError(f"sweep.space: '{key}' is not an option of fit.", hint)
        if any(a == f"--{key}" or a.startswith(f"--{key}=") for a in command.fit_args):
            raise UserError(
                f"--{key} is given as a flag, and it is searched (sweep.space.{key}).",
                "remove the flag, or the key from sweep.space.",
            )


def _dotted(tree: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= _dotted(value, f"{prefix}{key}.")
    return keys


def trial_params(trial: optuna.trial.FrozenTrial, sweep: Sweep) -> dict[str, Any]:
    """The trial's parameters, once each is a key of sweep.space with a value that space can draw.

    The study storage may be shared (a database server) and written by others: what it holds is data
    to check, never a config to run.
    """
    where = f"Trial {trial.number} of study '{sweep.name}'"
    if set(trial.params) != set(sweep.space):
        raise UserError(
            f"{where} has the parameters {_shown(sorted(trial.params))}, but sweep.space searches "
            f"{_shown(sorted(sweep.space))}.",
            "run --summary with the sweep config (and flags) that ran the study.",
        )
    for key, value in trial.params.items():
        entry = sweep.space[key]
        if not _drawable(entry, value):
            raise UserError(
                f"{where} has {key}={_shown(value)}, which sweep.space.{key} {_shown(entry)} cannot draw: "
                "the study storage was written by something other than this sweep.",
                "check who can write the study storage; run --summary with the sweep config that ran "
                "the study, or start a new study with another --sweep.name.",
            )
    return dict(trial.params)


def check_run_name(trial: optuna.trial.FrozenTrial, sweep: Sweep) -> str:
    """The trial's run, `<study>/trial-<number>`, after checking that the storage records that one."""
    expected = run_name(sweep.name, trial.number)
    stored = trial.user_attrs.get("run")
    if stored != expected:
        raise UserError(
            f"Trial {trial.number} of study '{sweep.name}' records its run as {_shown(stored)}; this sweep "
            f"names it '{expected}': the study storage was written by something other than this sweep.",
            "check who can write the study storage, or start a new study with another --sweep.name.",
        )
    return expected


def _drawable(entry: dict[str, Any], value: Any) -> bool:
    """Whether `value` is one the space entry (checked by settings.check_space) can give."""
    if entry["type"] == "categorical":
        return any(type(value) is type(choice) and value == choice for choice in entry["choices"])
    number = int if entry["type"] == "int" else int | float
    if not isinstance(value, number) or isinstance(value, bool) or not math.isfinite(value):
        return False
    if not entry["low"] <= value <= entry["high"]:
        return False
    step = entry.get("step")
    return not (entry["type"] == "int" and step and (value - entry["low"]) % step)


def _shown(value: Any) -> str:
    """A value from the storage, quoted and cut short for a one-line message."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
