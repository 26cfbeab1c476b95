"""The study so far: its best trial as logs/<study>/best.yaml and a ready fit command, and its pictures.

best.yaml is built here, from this command's sweep config and fit flags plus the best trial's
parameters (each checked against sweep.space): the study storage may be a shared database that others
can write, so a config stored there (class paths included) is never what the user is told to run.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from project.atomic import atomic_write
from project.errors import UserError
from project.runs import LOGS
from project.sweep.options import check_run_name, check_space_keys, fit_options, trial_params
from project.sweep.settings import Command, flag

CALLBACK_CLASS = "SweepTrial"  # project.sweep.trial: meaningless outside a sweep
PICTURES = ("optimization_history", "param_importances", "parallel_coordinate")


def summarize(study: optuna.Study, command: Command) -> Path:
    """Print the best trial and its fit command; write best.yaml and the PNGs into logs/<study>/."""
    sweep = command.sweep
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        raise UserError(
            f"Study '{sweep.name}' has no complete trial yet.",
            "run the sweep (the same command without --summary) until a trial completes.",
        )
    best = study.best_trial
    run = check_run_name(best, sweep)
    params = trial_params(best, sweep)
    config = best_config(command, params)
    folder = LOGS / sweep.name
    folder.mkdir(parents=True, exist_ok=True)
    best_yaml = write_best_config(config, best, folder / "best.yaml", sweep)
    counts = {s.name.lower(): n for s in TrialState if (n := len(study.get_trials(False, states=(s,))))}
    print(f"\nstudy {sweep.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    print(f"best: trial {best.number} ({LOGS / run}), {sweep.metric}={best.value:.4f}")
    for key, value in params.items():
        print(f"  {key}: {value}")
    print(f"run it:  python -m project fit --config {best_yaml}")
    for note in write_pictures(study, folder):
        print(note)
    return best_yaml


def best_config(command: Command, params: dict[str, Any]) -> dict[str, Any]:
    """The config fit resolves from this command's configs and flags plus `params`, less what belongs to
    one run (its name, its folders) and to a sweep trial (its callback)."""
    config = fit_options([*command.fit_args, *(flag(key, value) for key, value in params.items())])
    check_space_keys(command, config)
    for key in ("name", "ckpt_path"):
        config.pop(key, None)
    if isinstance(config.get("checkpoint"), dict):
        config["checkpoint"]["dirpath"] = None  # checkpoints/<new run>/
    trainer = config.get("trainer") or {}
    logger = trainer.get("logger")
    if isinstance(logger, dict) and isinstance(logger.get("init_args"), dict):
        for key in ("name", "version"):
            logger["init_args"].pop(key, None)
    if isinstance(trainer.get("callbacks"), list):
        trainer["callbacks"] = [
            c for c in trainer["callbacks"]
            if not (isinstance(c, dict) and str(c.get("class_path", "")).endswith(CALLBACK_CLASS))
        ]  # fmt: skip
    return config


def write_best_config(config: dict[str, Any], best: optuna.trial.FrozenTrial, path: Path, sweep: Any) -> Path:
    """`config` as logs/<study>/best.yaml, with a header saying which trial it is and how it was built."""
    header = (
        f"# Best trial of sweep '{sweep.name}': trial {best.number}, {sweep.metric}={best.value:.6g}.\n"
        "# Built from the sweep config and fit flags given to --summary, plus the trial's parameters.\n"
        f"# python -m project fit --config {path}\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (header + yaml.safe_dump(config, sort_keys=False)).encode())
    return path


def write_pictures(study: optuna.Study, folder: Path) -> list[str]:
    """Optuna's matplotlib pictures of the study as PNGs; a note for each one written or skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    from project.figures import plain_text, plain_ticks

    notes = []
    for name in PICTURES:
        reason = _cannot_draw(study, name)
        if reason:
            notes.append(f"{name}.png skipped: {reason}")
            continue
        # option names and values are text: neither mathtext nor LaTeX (a matplotlibrc's usetex)
        with plain_text(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ExperimentalWarning, on every call
            axes = getattr(plots, f"plot_{name}")(study)
            figure = plain_ticks(getattr(axes, "figure", None) or axes.flat[0].figure)
            image = io.BytesIO()
            figure.savefig(image, format="png", bbox_inches="tight")
        plt.close(figure)
        atomic_write(folder / f"{name}.png", image.getbuffer())
        notes.append(f"picture: {folder / name}.png")
    return notes


def _cannot_draw(study: optuna.Study, name: str) -> str | None:
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if name == "optimization_history":
        return None
    varied = [k for k in complete[0].params if len({repr(t.params.get(k)) for t in complete}) > 1]
    if len(complete) < 2 or not varied:
        return "needs 2 complete trials whose parameters differ"
    return None
