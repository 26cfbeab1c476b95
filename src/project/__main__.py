"""The one entry point, of `python -m project ...` and of the installed `project` script: dispatch only.

The commands of COMMANDS (infer, ...) have a module of their own and skip the training CLI
(most of them torch too): they go first. Everything else is a LightningCLI subcommand of
project.cli (TRAINING: fit, validate, test, predict and the Trainer's own, such as export). Every command's
main ends a user's mistake the same way
(project.errors.exits_on_user_error).
"""

from __future__ import annotations

import sys
from importlib import import_module

from project.errors import UserError, exits_on_user_error, extra_packages, missing_package, module_of

# command -> (module whose main(argv) runs it, what it does: the training CLI's --help lists these, the
# extra of pyproject.toml its packages come from or None); everything else is a LightningCLI subcommand
# (project.cli)
COMMANDS = {
    "infer": ("project.deploy.infer", "torch-free inference on an export", None),
    # room: serve begin
    "serve": ("project.deploy.serve.command", "an HTTP service for an export", "serve"),
    # room: serve end
    # room: report begin
    "report": ("project.report", "a run's curves as a PNG", None),
    # room: report end
    # room: doctor begin
    "doctor": ("project.doctor", "check this machine", None),
    # room: doctor end
    # room: new begin
    "new": ("project.new", "start a task from this template", None),
    # room: new end
    # room: sweep begin
    "sweep": ("project.sweep.command", "a hyperparameter search over these options", "sweep"),
    # room: sweep end
    # room: audit begin
    "audit": ("project.audit.command", "wrong labels, duplicates, leaks", "audit"),
    # room: audit end
    # room: models begin
    "models": ("project.models", "the backbones --model.backbone takes", None),
    # room: models end
    # room: shards begin
    "optimize": ("project.optimize", "a data set as LitData shards, local or in a bucket", "shards"),
    # room: shards end
}


# the LightningCLI subcommands, named without importing torch: subcommand -> what it does with a run.
# project.cli builds its subcommands and their run handling from this: `train` (fit), `checkpoint`
# (evaluates --ckpt_path: its classes, image size and data settings apply), `dry` (looks at the configured
# model and data: no checkpoint, no run folder), `finder` (tries training steps, then prints the flag to
# pass to fit: no checkpoint; its plot in logs/<name>/). A Trainer method of the same name runs each.
TRAINING = {
    "fit": "train",
    "validate": "checkpoint",
    "test": "checkpoint",
    "predict": "checkpoint",
    "export": "checkpoint",
    "memory": "dry",  # room: memory
    "show_batch": "dry",  # room: pictures
    "lr_find": "finder",  # room: tuning
    "batch_size_find": "finder",  # room: tuning
}


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
        if (missing := _without_extra(command, extra, e)) is not None:
            raise missing from None
        raise
    try:
        if command in COMMANDS:
            run(sys.argv[2:])
        else:
            run()  # LightningCLI reads sys.argv itself
    except ModuleNotFoundError as e:  # a command that imports its extra's packages once its flags are read
        if (missing := _without_extra(command, extra, e)) is not None:
            raise missing from None
        raise


def _without_extra(command: str | None, extra: str | None, error: ModuleNotFoundError) -> UserError | None:
    """The one-line UserError when the missing module is a package of the command's extra; else None."""
    packages = extra_packages(extra) if extra else ""
    missing = error.name or ""  # a package's own submodule missing: the package is there, but broken
    names = {module_of(name) for name in packages.split()}
    if not extra or not missing or "." in missing or (names and missing.lower() not in names):
        return None
    return missing_package(f"`{command}`", extra, packages or missing)


if __name__ == "__main__":
    main()
