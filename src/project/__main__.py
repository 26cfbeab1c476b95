"""The one entry point, of `python -m project ...` and of the installed `project` script: dispatch only.

infer, serve, report, doctor, new, sweep, audit, models and optimize have a module of their own and skip
the training CLI (most of them torch too): they go first. Everything else is a LightningCLI subcommand of
project.cli: fit, validate, test, predict and the Trainer's export, memory, show_batch, lr_find and
batch_size_find. Every command's main ends a user's mistake the same way
(project.errors.exits_on_user_error).
"""

from __future__ import annotations

import sys
from importlib import import_module

from project.errors import UserError, exits_on_user_error

# command -> (module whose main(argv) runs it, what it does: the training CLI's --help lists these);
# everything else is a LightningCLI subcommand (project.cli)
COMMANDS = {
    "infer": ("project.deploy.infer", "torch-free inference on an export"),
    "serve": ("project.deploy.serve.command", "an HTTP service for an export"),
    "report": ("project.report", "a run's curves as a PNG"),
    "doctor": ("project.doctor", "check this machine"),
    "new": ("project.new", "start a task from this template"),
    "sweep": ("project.sweep.command", "a hyperparameter search over these options"),
    "audit": ("project.audit.command", "wrong labels, duplicates, leaks"),
    "models": ("project.models", "the backbones --model.backbone takes"),
    "optimize": ("project.optimize", "a data set as LitData shards, local or in a bucket"),
}


# the LightningCLI subcommands (project.cli.ProjectCLI.subcommands()), named without importing torch
TRAINING = (
    "fit",
    "validate",
    "test",
    "predict",
    "export",
    "memory",
    "show_batch",
    "lr_find",
    "batch_size_find",
)


@exits_on_user_error
def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command is None:  # LightningCLI's own usage would list its subcommands only
        raise UserError(
            f"No command given; the commands are {', '.join((*TRAINING, *COMMANDS))}.",
            "run `python -m project COMMAND` (a bare `python -m project fit` trains the default model), "
            "or `python -m project COMMAND --help` for its options.",
        )
    try:
        run = import_module(COMMANDS[command][0] if command in COMMANDS else f"{__package__}.cli").main
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith(f"{__package__}."):
            raise
        # the serving install (deploy/pyproject.toml) ships project.deploy and the modules it needs only
        raise UserError(
            f"`{command or 'fit'}` is not part of this install, which runs only `infer` and `serve` "
            "(the serving install, without torch).",
            "install the training package (pip install . in a checkout) on a machine that trains.",
        ) from None
    if command in COMMANDS:
        run(sys.argv[2:])
    else:
        run()  # LightningCLI reads sys.argv itself


if __name__ == "__main__":
    main()
