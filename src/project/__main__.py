"""The one entry point, of `python -m project ...` and of the installed `project` script: dispatch only.

infer, serve, report, new, doctor, sweep, audit and models skip LightningCLI (and most of them torch):
they go first.
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
    "models": "project.models",
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
