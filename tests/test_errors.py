"""The one error path: every command ends a mistake with one `error: ... Fix: ...` line and status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# One bad value per command; each fails while the options are read, before any model or data work.
MISTAKES = {
    "fit": ["--data.batch_size=0"],
    "validate": ["--ckpt_path=missing.ckpt"],
    "test": ["--ckpt_path=missing.ckpt"],
    "predict": ["--ckpt_path=missing.ckpt"],
    "export": ["--ckpt_path=missing.ckpt"],
    "memory": ["--data.batch_size=0"],
    "lr_find": ["--data.batch_size=0"],
    "batch_size_find": ["--data.batch_size=0"],
    "audit": ["--data.batch_size=0"],
    "sweep": ["--config", "missing.yaml"],
    "infer": ["image.jpg", "--model", "model.onnx", "--top_k", "0"],
    "serve": ["--model", "model.onnx", "--max_batch_size=0"],
    "new": ["elsewhere", "--name", "1bad"],
    "report": ["missing-run"],
    "doctor": ["--workers", "-1"],
    "models": ["no-such-backbone-anywhere"],
    "optimize": ["--output=out", "--max_side=0"],
}

# Runs `python -m project COMMAND ARGS...` for each command in one interpreter (torch is imported once, not
# once a command), with its own stdout and stderr, and records the status the process would exit with.
DRIVER = """
import json, os, sys, tempfile, traceback
from project.__main__ import COMMANDS, main
from project.cli import ProjectCLI

outcomes = {"commands": sorted(set(COMMANDS) | set(ProjectCLI.subcommands()))}
for command, args in json.loads(sys.argv[1]).items():
    sys.argv = ["project", command, *args]
    with tempfile.TemporaryFile("w+") as output:
        sys.stdout.flush(), sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(output.fileno(), 1), os.dup2(output.fileno(), 2)
        try:
            main()
            status = 0
        except SystemExit as e:  # as the interpreter ends: a text is printed, status 1
            status = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
        except BaseException:
            status = 1
            traceback.print_exc()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        output.seek(0)
        outcomes[command] = {"status": status, "output": output.read()}
print(json.dumps(outcomes))
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each command's exit status and output, run in a folder of their own (for what they may write there)."""
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(MISTAKES)],
        cwd=tmp_path_factory.mktemp("commands"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_every_command_has_a_mistake_here(outcomes: dict) -> None:
    """A new command (in __main__.COMMANDS or a LightningCLI subcommand) gets its row in MISTAKES."""
    assert sorted(MISTAKES) == outcomes["commands"]


@pytest.mark.parametrize("command", MISTAKES)
def test_a_mistake_is_one_error_line_with_its_fix_and_status_2(
    outcomes: dict[str, dict], command: str
) -> None:
    outcome = outcomes[command]
    errors = [line for line in outcome["output"].splitlines() if line.startswith("error:")]
    assert outcome["status"] == 2, outcome["output"]
    assert len(errors) == 1 and " Fix: " in errors[0], outcome["output"]
    assert "Traceback" not in outcome["output"]
