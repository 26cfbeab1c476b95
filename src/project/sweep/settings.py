"""The `sweep:` section of a config and the `--sweep.*` flags: taken off the argv and checked, key by key.

Everything else on the command line (configs, flags) is fit's, passed on to every trial unchanged.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

from project.errors import UserError
from project.metrics import MONITOR
from project.runs import LOGS

SECTION = "sweep"
DEFAULTS: dict[str, Any] = {
    "name": None,  # the study; default: the sweep config's file name without .yaml
    "trials": 20,  # finished trials (complete or pruned) the study should have
    "storage": None,  # default: the SQLite file logs/<name>/study.db
    "space": None,
    "metric": MONITOR,
    "direction": "maximize",
    "pruner": "median",
    "heartbeat": 10,  # seconds between a running trial's signs of life; silent for 3x this: failed
}
DIRECTIONS = {"max": "maximize", "maximize": "maximize", "min": "minimize", "minimize": "minimize"}
PRUNERS: dict[str, type[optuna.pruners.BasePruner]] = {
    "median": optuna.pruners.MedianPruner,
    "percentile": optuna.pruners.PercentilePruner,
    "hyperband": optuna.pruners.HyperbandPruner,
    "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
    "threshold": optuna.pruners.ThresholdPruner,
    "none": optuna.pruners.NopPruner,
}
FIELDS = {
    "float": {"type", "low", "high", "log", "step"},
    "int": {"type", "low", "high", "log", "step"},
    "categorical": {"type", "choices"},
}
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # one folder name: logs/<name>


@dataclass(frozen=True)
class Sweep:
    """A checked sweep section."""

    name: str
    trials: int
    storage: str  # a database URL
    space: dict[str, dict[str, Any]]
    metric: str
    direction: str  # "maximize" or "minimize"
    pruner: dict[str, Any]  # {"type": one of PRUNERS, **its keyword arguments}
    heartbeat: int


@dataclass(frozen=True)
class Command:
    """The sweep command line, split: the sweep's settings and the arguments every trial's fit gets."""

    sweep: Sweep
    fit_args: list[str]
    summary: bool


def parse_argv(argv: list[str]) -> Command:
    """Take `sweep:` sections out of the --config files, `--sweep.*` flags and --summary off the argv."""
    section: dict[str, Any] = {}
    fit_args: list[str] = []
    summary, default_name = False, None
    args = iter(argv)
    for arg in args:
        if arg == "--summary":
            summary = True
        elif arg == "--config" or arg.startswith("--config="):
            path = arg.split("=", 1)[1] if "=" in arg else next(args, None)
            if path is None:
                raise UserError("--config needs a file.", "pass --config configs/sweeps/<name>.yaml.")
            fit_config, found = _split_config(path)
            if found is not None:
                section.update(found)
                default_name = Path(path).stem
            fit_args += ["--config", fit_config]
        elif arg.startswith(f"--{SECTION}."):
            key, _, value = arg[len(SECTION) + 3 :].partition("=")
            if not _:
                value = next(args, "")
            section[key] = yaml.safe_load(value)
        else:
            fit_args.append(arg)
    _reject_run_flags(fit_args)
    return Command(check_section(section, default_name), fit_args, summary)


def _split_config(path: str) -> tuple[str, dict[str, Any] | None]:
    """The config as fit gets it (inline YAML when a `sweep:` section had to come out), and that section."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"Config file '{path}' (--config) does not exist.", "check the path.")
    config = yaml.safe_load(file.read_text()) or {}
    if not isinstance(config, dict) or SECTION not in config:
        return path, None
    section = config.pop(SECTION)
    if not isinstance(section, dict):
        raise UserError(
            f"'{SECTION}:' in '{path}' is {section!r}, not a mapping.", "see configs/sweeps/ for the format."
        )
    # jsonargparse takes a config's text in place of its path
    return (yaml.safe_dump(config, sort_keys=False) if config else "{}"), section


def _reject_run_flags(fit_args: list[str]) -> None:
    for flag in ("--name", "--ckpt_path"):
        if any(a == flag or a.startswith(f"{flag}=") for a in fit_args):
            raise UserError(
                f"{flag} cannot be given to sweep: each trial is its own run, logs/<study>/trial-<number>.",
                f"remove {flag}; name the study with --sweep.name.",
            )


def check_section(section: dict[str, Any], default_name: str | None) -> Sweep:
    """Defaults filled in; each key checked, failing with one message naming it."""
    unknown = set(section) - set(DEFAULTS)
    for key in sorted(unknown):
        close = difflib.get_close_matches(key, DEFAULTS, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"the keys are: {', '.join(DEFAULTS)}."
        raise UserError(f"'{SECTION}.{key}' is not a sweep setting.", hint)
    s = {**DEFAULTS, **section}
    name = s["name"] or default_name
    if not isinstance(name, str) or not STUDY_NAME.match(name):
        raise UserError(
            f"sweep.name={name!r} is not a study name (letters, digits, '.', '_', '-'; one folder in logs/).",
            "set sweep.name in the sweep config or pass --sweep.name=my-study.",
        )
    trials, heartbeat = s["trials"], s["heartbeat"]
    for key, value in (("trials", trials), ("heartbeat", heartbeat)):
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise UserError(f"sweep.{key}={value!r} must be an integer >= 1.", f"set --sweep.{key}=10.")
    direction = DIRECTIONS.get(str(s["direction"]).lower())
    if direction is None:
        raise UserError(
            f"sweep.direction={s['direction']!r} is neither maximize (max) nor minimize (min).",
            "set --sweep.direction=maximize for accuracy, minimize for a loss.",
        )
    if not isinstance(s["metric"], str) or not s["metric"]:
        raise UserError(
            f"sweep.metric={s['metric']!r} is not a metric name.", "set e.g. sweep.metric: val/acc."
        )
    return Sweep(
        name=name,
        trials=trials,
        storage=storage_url(s["storage"], name),
        space=check_space(s["space"]),
        metric=s["metric"],
        direction=direction,
        pruner=check_pruner(s["pruner"]),
        heartbeat=heartbeat,
    )


def storage_url(storage: Any, name: str) -> str:
    """A database URL; a plain path is an SQLite file; none is logs/<name>/study.db."""
    if storage is None:
        return f"sqlite:///{LOGS / name / 'study.db'}"
    if not isinstance(storage, str) or not storage:
        raise UserError(
            f"sweep.storage={storage!r} is neither a database URL nor a file.",
            "set e.g. sweep.storage: postgresql://user:password@host/db, or a path for an SQLite file.",
        )
    return storage if "://" in storage else f"sqlite:///{storage}"


def check_space(space: Any) -> dict[str, dict[str, Any]]:
    """`{option: {type, low, high, log, step} | {type: categorical, choices}}`, each entry checked."""
    if not isinstance(space, dict) or not space:
        raise UserError(
            f"sweep.space is {space!r}: there is nothing to search.",
            "declare options to search, e.g. `model.optimizer.init_args.lr: {type: float, low: 1e-4, "
            "high: 1e-2, log: true}` under sweep.space.",
        )
    for key, entry in space.items():
        _check_entry(f"sweep.space.{key}", entry)
    return space


def _check_entry(where: str, entry: Any) -> None:
    kind = entry.get("type") if isinstance(entry, dict) else None
    if kind not in FIELDS:
        raise UserError(
            f"{where}: type {kind!r} is not one of {', '.join(FIELDS)}.",
            "write e.g. {type: float, low: 0.0001, high: 0.01, log: true} "
            "or {type: categorical, choices: [a, b]}.",
        )
    extra = set(entry) - FIELDS[kind]
    if extra:
        raise UserError(
            f"{where}: {', '.join(sorted(extra))} is not a field of a {kind} range.",
            f"use only {', '.join(sorted(FIELDS[kind]))}.",
        )
    if kind == "categorical":
        choices = entry.get("choices")
        if not isinstance(choices, list) or not choices:
            raise UserError(
                f"{where}: choices {choices!r} is not a non-empty list.", "write choices: [a, b]."
            )
        if not all(c is None or isinstance(c, bool | int | float | str) for c in choices):
            raise UserError(
                f"{where}: choices {choices!r} holds a list or mapping; Optuna records only plain values.",
                "use names, numbers, true/false or null as choices.",
            )
        return
    low, high = entry.get("low"), entry.get("high")
    number = int if kind == "int" else int | float
    for field, value in (("low", low), ("high", high)):
        if not isinstance(value, number) or isinstance(value, bool) or not math.isfinite(value):
            raise UserError(
                f"{where}: {field}={value!r} is not {'an integer' if kind == 'int' else 'a number'}.",
                f"set {field} to {'an integer' if kind == 'int' else 'a number'}.",
            )
    if low > high:
        raise UserError(f"{where}: low={low!r} is above high={high!r}.", "swap them, or fix the range.")
    if entry.get("log") and entry.get("step") is not None:
        raise UserError(f"{where}: log=true and step cannot go together (Optuna).", "drop one of them.")
    if entry.get("log") and low <= 0:
        raise UserError(f"{where}: log=true needs low > 0, not {low!r}.", "raise low, or drop log.")


def check_pruner(spec: Any) -> dict[str, Any]:
    """`median` or `{type: median, n_warmup_steps: 1, ...}`; the keyword arguments are tried here."""
    spec = {"type": spec} if isinstance(spec, str) or spec is None else spec
    if not isinstance(spec, dict) or str(spec.get("type")).lower() not in PRUNERS:
        kind = spec.get("type") if isinstance(spec, dict) else spec
        raise UserError(
            f"sweep.pruner {kind!r} is not a pruner this sweep knows.",
            f"use one of {', '.join(PRUNERS)} (or {{type: median, n_warmup_steps: 1}} with its arguments).",
        )
    spec = {**spec, "type": str(spec["type"]).lower()}
    make_pruner(spec)
    return spec


def rdb_storage(url: str, **kwargs: Any) -> optuna.storages.RDBStorage:
    """Optuna's database storage; processes sharing one SQLite file wait for its lock rather than fail."""
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)


def make_pruner(spec: dict[str, Any]) -> optuna.pruners.BasePruner:
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    try:
        return PRUNERS[spec["type"]](**kwargs)
    except (TypeError, ValueError) as e:
        raise UserError(
            f"sweep.pruner {spec['type']} does not take {kwargs}: {e}.",
            f"see optuna.pruners.{PRUNERS[spec['type']].__name__} for its arguments.",
        ) from None


def suggest(trial: optuna.Trial, space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One value per option, drawn by the study's sampler."""
    values = {}
    for key, entry in space.items():
        kind, options = entry["type"], {k: v for k, v in entry.items() if k != "type"}
        if kind == "categorical":
            values[key] = trial.suggest_categorical(key, options["choices"])
        elif kind == "int":
            values[key] = trial.suggest_int(key, **options)
        else:
            values[key] = trial.suggest_float(key, **options)
    return values


def run_name(study: str, number: int) -> str:
    """logs/<study>/trial-0007 and checkpoints/<study>/trial-0007: the trial's run."""
    return f"{study}/trial-{number:04d}"


def flag(key: str, value: Any) -> str:
    """`--key=value` as fit reads it: strings as they are, everything else as JSON (true, null, 0.001)."""
    return f"--{key}={value if isinstance(value, str) else json.dumps(value)}"
