"""The one entry point, of `python -m project ...` and of the installed `project` script: dispatch only.

The commands of COMMANDS (infer, report, new, ...) have a module of their own and skip the training CLI
(most of them torch too): they go first. Everything else is a LightningCLI subcommand of
project.cli: fit, validate, test, predict and the Trainer's export, memory, show_batch, lr_find and
batch_size_find. Every command's main ends a user's mistake the same way
(project.errors.exits_on_user_error).
"""

from __future__ import annotations

import sys
from importlib import import_module

from project.errors import UserError, exits_on_user_error, extra_packages, missing_package

# command -> (module whose main(argv) runs it, what it does: the training CLI's --help lists these, the
# extra of pyproject.toml its packages come from or None); everything else is a LightningCLI subcommand
# (project.cli)
COMMANDS = {
    "infer": ("project.deploy.infer", "torch-free inference on an export", None),
    "serve": ("project.deploy.serve.command", "an HTTP service for an export", "serve"),  # room: serve
    "report": ("project.report", "a run's curves as a PNG", None),
    "doctor": ("project.doctor", "check this machine", None),  # room: doctor
    "new": ("project.new", "start a task from this template", None),
    "sweep": ("project.sweep.command", "a hyperparameter search over these options", "sweep"),  # room: sweep
    "audit": ("project.audit.command", "wrong labels, duplicates, leaks", "audit"),  # room: audit
    "models": ("project.models", "the backbones --model.backbone takes", None),
    "optimize": ("project.optimize", "a data set as LitData shards, local or in a bucket", "shards"),
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
    module, _, extra = COMMANDS.get(command, (f"{__package__}.cli", None, None))
    try:
        run = import_module(module).main
    except ModuleNotFoundError as e:
        if (e.name or "").startswith(f"{__package__}."):
            # a partial install: the serving one ships project.deploy and the modules it needs only
            raise UserError(
                f"`{command or 'fit'}` is not part of this install, which runs only `infer` and `serve` "
                "(the serving install, without torch).",
                "install the training package (pip install . in a checkout) on a machine that trains.",
            ) from None
        raise _without_extra(command, extra, e) from None
    try:
        if command in COMMANDS:
            run(sys.argv[2:])
        else:
            run()  # LightningCLI reads sys.argv itself
    except ModuleNotFoundError as e:  # a command that imports its extra's packages once its flags are read
        raise _without_extra(command, extra, e) from None


def _without_extra(command: str | None, extra: str | None, error: ModuleNotFoundError) -> Exception:
    """The one-line UserError when the missing module is a package of the command's extra; else the error."""
    packages = extra_packages(extra) if extra else ""
    missing = (error.name or "").partition(".")[0]
    names = {name.lower().replace("-", "_").removeprefix("python_") for name in packages.split()}
    if not extra or not missing or (names and missing.lower() not in names):
        return error
    return missing_package(f"`{command}`", extra, packages or missing)


if __name__ == "__main__":
    main()
