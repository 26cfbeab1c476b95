"""The one entry point, of `python -m project ...` and of the installed `project` script: dispatch only.

infer, serve, report, doctor, new, sweep and audit have a module of their own and skip the training CLI
(most of them torch too): they go first. Everything else is a LightningCLI subcommand of project.cli:
fit, validate, test, predict and the Trainer's export, memory, lr_find and batch_size_find. Every
command's main ends a user's mistake the same way (project.errors.exits_on_user_error).
"""

from __future__ import annotations

import sys
from importlib import import_module

# command -> module whose main(argv) runs it; everything else is a LightningCLI subcommand (project.cli)
COMMANDS = {
    "infer": "project.deploy.infer",
    "serve": "project.deploy.serve.command",
    "report": "project.report",
    "doctor": "project.doctor",
    "new": "project.new",
    "sweep": "project.sweep.command",
    "audit": "project.audit.command",
}


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else None
    if command in COMMANDS:
        import_module(COMMANDS[command]).main(sys.argv[2:])
    else:
        from project.cli import main as cli_main

        cli_main()


if __name__ == "__main__":
    main()
