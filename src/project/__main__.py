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
    try:
        run = import_module(COMMANDS.get(command, f"{__package__}.cli")).main
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith(f"{__package__}."):
            raise
        # the serving install (deploy/pyproject.toml) ships project.deploy and the modules it needs only
        print(
            f"error: `{command or 'fit'}` is not part of this install, which runs only `infer` and `serve` "
            "(the serving install, without torch). Fix: install the training package (pip install . in a "
            "checkout) on a machine that trains.",
            file=sys.stderr,
        )
        sys.exit(2)
    if command in COMMANDS:
        run(sys.argv[2:])
    else:
        run()  # LightningCLI reads sys.argv itself


if __name__ == "__main__":
    main()
