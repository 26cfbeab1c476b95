"""Experiment trackers beside TensorBoard (`--config configs/presets/mlflow.yaml`, wandb.yaml, csv.yaml).

`trackers:` in a config (or `--trackers+=...`) lists Lightning's own loggers (MLFlowLogger, WandbLogger,
CSVLogger); `fit` logs to each as well as to `trainer.logger` (TensorBoard). This module settles
their settings from the run (its name, its folders) and from the trackers' own environment variables,
says which extra to install when a package is missing, and turns the resolved configuration into flat,
readable parameters. What they get at the end (best checkpoint, export, report, data check) is
project.callbacks.trackers.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Mapping
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.loggers import Logger

from project.errors import missing_package
from project.terminal import without_credentials

# Lightning's logger class -> the package it needs (in the `trackers` extra)
PACKAGES = {
    "lightning.pytorch.loggers.MLFlowLogger": "mlflow",
    "lightning.pytorch.loggers.mlflow.MLFlowLogger": "mlflow",
    "lightning.pytorch.loggers.WandbLogger": "wandb",
    "lightning.pytorch.loggers.wandb.WandbLogger": "wandb",
}
# MLFlowLogger's default experiment (MLFLOW_EXPERIMENT_NAME replaces it, as in MLflow's own API)
LIGHTNING_EXPERIMENT = "lightning_logs"


def require_packages(trackers: Iterable[Namespace]) -> None:
    """Nothing when every tracker's package is installed; else the UserError naming the extra."""
    for tracker in trackers:
        package = PACKAGES.get(tracker.class_path)
        if package and importlib.util.find_spec(package) is None:
            name = tracker.class_path.rsplit(".", 1)[-1]
            raise missing_package(f"The tracker {name} (trackers: in the config)", "trackers", package)


def configure(trackers: Iterable[Namespace], name: str, subcommand: str) -> None:
    """Each tracker's run takes the run's name and lives beside its TensorBoard folder; the trackers'
    own environment variables win over the defaults (never over a value the config sets)."""
    for tracker in trackers:
        args = tracker.init_args
        kind = tracker.class_path.rsplit(".", 1)[-1]
        if kind == "MLFlowLogger":
            # MLFlowLogger reads MLFLOW_TRACKING_URI when Lightning is imported, not when it runs
            args.tracking_uri = args.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
            if args.get("experiment_name", LIGHTNING_EXPERIMENT) == LIGHTNING_EXPERIMENT:
                args.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", LIGHTNING_EXPERIMENT)
            args.run_name = args.get("run_name") or run_label(name, subcommand)
            # MLflow prints the run's link with the tracking URI as given, a user:password@ included;
            # the block fit ends with prints it without (project.callbacks.trackers.links)
            os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        elif kind == "WandbLogger":
            args.name = args.get("name") or run_label(name, subcommand)
            if os.environ.get("WANDB_DIR"):
                args.save_dir = None  # wandb.init(dir=...) would override it
        elif kind == "CSVLogger":
            args.name = name
            # logs/<name>/csv/metrics.csv: TensorBoard's folder is logs/<name>, and the CSV writer
            # clears a non-empty folder's metrics.csv
            args.version = "csv" if subcommand == "fit" else f"{subcommand}/csv"


def beside(logger: Any, added: list[Logger]) -> list[Logger]:
    """`trainer.logger` (a logger, a list, or false: only the trackers; true, Lightning's default logger,
    is not kept) followed by the trackers: the first stays the trainer's `logger`."""
    if isinstance(logger, list | tuple):
        return [*logger, *added]
    return [logger, *added] if isinstance(logger, Logger) else list(added)


def run_label(name: str, subcommand: str) -> str:
    """The tracker's run name: the run's own for fit, `<run>/<subcommand>` for an evaluation."""
    return name if subcommand == "fit" else f"{name}/{subcommand}"


def flat_params(config: Mapping[str, Any] | Namespace, skip: Iterable[str] = ("trackers",)) -> dict[str, Any]:
    """The resolved configuration as `{"model.backbone": "resnet18", "model.optimizer": "torch.optim.AdamW",
    "model.optimizer.lr": 0.002, ...}`: dotted keys, a class's arguments under its own key (no
    `init_args`), numbers and booleans as they are, the rest as text without credentials. `skip`:
    top-level keys left out (the trackers' own settings)."""
    params: dict[str, Any] = {}
    _flatten(_plain(config), "", params, set(skip))
    return params


def _plain(value: Any) -> Any:
    return value.as_dict() if isinstance(value, Namespace) else value


def _flatten(value: Any, key: str, params: dict[str, Any], skip: set[str]) -> None:
    value = _plain(value)
    if isinstance(value, dict):
        if "class_path" in value:  # a class: its name under the key, its arguments below it
            params[key] = str(value["class_path"])
            value = _plain(value.get("init_args")) or {}
        for name, item in value.items():
            if not key and name in skip:
                continue
            _flatten(item, f"{key}.{name}" if key else str(name), params, skip)
        return
    if isinstance(value, list | tuple) and any(isinstance(_plain(v), dict) for v in value):
        for index, item in enumerate(value):
            _flatten(item, f"{key}.{index}", params, skip)
        return
    params[key] = _scalar(value)


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return without_credentials(str([_scalar(item) for item in value]))
    return without_credentials(str(value))  # a str, or a path (jsonargparse's Path prints as one)
