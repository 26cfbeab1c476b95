"""The one error path: every command ends a mistake with one `error: ... Fix: ...` line and status 2."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import project
from project.__main__ import COMMANDS
from project.errors import module_of, usage_error

# One bad value per command; each fails while the options are read, before any model or data work.
MISTAKES = {
    "fit": ["--data.batch_size=0"],
    "validate": ["--ckpt_path=missing.ckpt"],
    "test": ["--ckpt_path=missing.ckpt"],
    "predict": ["--ckpt_path=missing.ckpt"],
    "export": ["--ckpt_path=missing.ckpt"],
    "memory": ["--data.batch_size=0"],  # room: memory
    "show_batch": ["--data.batch_size=0"],  # room: pictures
    "lr_find": ["--data.batch_size=0"],  # room: tuning
    "batch_size_find": ["--data.batch_size=0"],  # room: tuning
    "audit": ["--data.batch_size=0"],  # room: audit
    "sweep": ["--config", "missing.yaml"],  # room: sweep
    "infer": ["image.jpg", "--model", "model.onnx", "--top_k", "0"],
    "serve": ["--model", "model.onnx", "--max_batch_size=0"],  # room: serve
    "new": ["elsewhere", "--name", "1bad"],  # room: new
    "report": ["missing-run"],  # room: report
    "doctor": ["--workers", "-1"],  # room: doctor
    "models": ["no-such-backbone-anywhere"],  # room: models
    "optimize": ["--output=out", "--max_side=0"],  # room: shards
}

SWEEP_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "sweeps" / "lr_wd.yaml")  # room: sweep
# A value of the wrong type, or an argument missing, unknown or without its value: argparse and
# jsonargparse printed their usage (147 lines for fit) and a bare `error:`; now one line with a fix.
COMMAND_LINES = {
    "fit": ["--data.batch_size=abc"],
    "validate": ["--data.batch_size=abc"],
    "test": ["--trainer.max_epochs=1.5"],
    "predict": ["--data.batchsize=8"],
    "export": ["--data.batch_size"],
    "memory": ["--data.hflip=maybe"],  # room: memory
    "show_batch": ["--count=many"],  # room: pictures
    "lr_find": ["--data.interpolation=nearest"],  # room: tuning
    "batch_size_find": ["--data.batch_size=abc"],  # room: tuning
    "audit": ["--data.batch_size=abc"],  # room: audit
    "sweep": ["--config", SWEEP_CONFIG, "--data.batch_size=abc"],  # room: sweep
    "infer": ["image.jpg", "--model", "model.onnx", "--top_k", "abc"],
    "serve": ["--model", "model.onnx", "--port", "abc"],  # room: serve
    "new": ["elsewhere"],  # room: new
    "report": [],  # room: report
    "doctor": ["--workers", "abc"],  # room: doctor
    "models": ["resnet*", "extra"],  # room: models
    "optimize": ["--output=out", "--workers=abc"],  # room: shards
}

# Runs `python -m project COMMAND ARGS...` for each named run in one interpreter (torch is imported once,
# not once a command), with its own stdout and stderr, and records the status the process would exit
# with. The modules named first are made unimportable, as if their packages were not installed.
DRIVER = """
import json, os, sys, tempfile, traceback
blocked, runs = json.loads(sys.argv[1])
for name in blocked:
    sys.modules[name] = None
from project.__main__ import COMMANDS, main
from project.cli import ProjectCLI

outcomes = {"commands": sorted(set(COMMANDS) | set(ProjectCLI.subcommands()))}
for key, (command, *args) in runs.items():
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
        outcomes[key] = {"status": status, "output": output.read()}
print(json.dumps(outcomes))
"""


def run_commands(runs: dict[str, list[str]], cwd: Path, blocked: list[str] | None = None) -> dict:
    """Each run's (`{key: [command, *args]}`) exit status and output, in `cwd` (for what they may write
    there), with the modules `blocked` unimportable."""
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps([blocked or [], runs])],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each command's outcome for its mistake (`mistake COMMAND`) and its refused command line (`line
    COMMAND`), from one interpreter."""
    runs = {f"mistake {command}": [command, *args] for command, args in MISTAKES.items()}
    runs |= {f"line {command}": [command, *args] for command, args in COMMAND_LINES.items()}
    return run_commands(runs, tmp_path_factory.mktemp("commands"))


def test_every_command_has_a_mistake_here(outcomes: dict) -> None:
    """A new command (in __main__.COMMANDS or a LightningCLI subcommand) gets its row in MISTAKES."""
    assert sorted(MISTAKES) == outcomes["commands"]


@pytest.mark.parametrize("command", MISTAKES)
def test_a_mistake_is_one_error_line_with_its_fix_and_status_2(
    outcomes: dict[str, dict], command: str
) -> None:
    assert_one_error_line(outcomes[f"mistake {command}"])


@pytest.mark.parametrize("command", COMMAND_LINES)
def test_a_refused_command_line_is_one_error_line_with_its_fix_not_the_usage(
    outcomes: dict[str, dict], command: str
) -> None:
    outcome = outcomes[f"line {command}"]
    assert_one_error_line(outcome)
    assert "usage:" not in outcome["output"]


# what reaches each optional command's import of its extra's packages
EXTRA_COMMAND_LINES = {
    "serve": ["--model", "model.onnx"],  # room: serve
    "sweep": ["--config", SWEEP_CONFIG],  # room: sweep
    "audit": ["--help"],  # room: audit
    "optimize": ["--output=out"],  # room: shards
}


def test_a_missing_package_of_a_commands_extra_is_one_error_naming_the_extra() -> None:
    """__main__'s one rule for every command with an extra (COMMANDS' third column)."""
    from project.__main__ import _without_extra

    missing = ModuleNotFoundError("No module named 'nonexistent_pkg'", name="nonexistent_pkg")
    error = _without_extra("pictures", "pictures", missing)
    assert error is not None and str(error) == (
        "`pictures` needs the `nonexistent_pkg` package, which is not installed. "
        "Fix: pip install -e '.[pictures]' (or pip install nonexistent_pkg)."
    )
    assert _without_extra("infer", None, missing) is None  # a command without an extra: a real bug
    broken = ModuleNotFoundError("No module named 'numpy.linalg'", name="numpy.linalg")
    assert _without_extra("pictures", "pictures", broken) is None  # installed but broken: not "install"


def test_each_command_whose_extra_is_missing_names_the_extra_in_one_line(tmp_path: Path) -> None:
    """With the packages of every command's extra unimportable (as in a core install), each command says
    which extra to install (its own: a command that reached into another's extra would fail here), and
    before it writes anything (optimize once generated the shapes data set first)."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    optional = pyproject["project"]["optional-dependencies"]
    assert {name for name, (_, _, extra) in COMMANDS.items() if extra} == set(EXTRA_COMMAND_LINES)
    extras = {command: COMMANDS[command][2] for command in EXTRA_COMMAND_LINES}
    blocked = sorted(
        {module_of(re.split(r"[<>=!~;\[ ]", r)[0]) for e in extras.values() for r in optional[e]}
    )
    runs = {command: [command, *arguments] for command, arguments in EXTRA_COMMAND_LINES.items()}
    outcomes = run_commands(runs, tmp_path, blocked)
    assert list(tmp_path.iterdir()) == []
    for command, extra in extras.items():
        assert_one_error_line(outcomes[command])
        assert re.search(
            rf"needs the .* not installed\. Fix: pip install -e '\.\[{extra}\]'", outcomes[command]["output"]
        )


def assert_one_error_line(outcome: dict) -> None:
    """Exit status 2 and one `error: ... Fix: ...` line, no traceback."""
    errors = [line for line in outcome["output"].splitlines() if line.startswith("error:")]
    assert outcome["status"] == 2, outcome["output"]
    assert len(errors) == 1 and " Fix: " in errors[0], outcome["output"]
    assert "Traceback" not in outcome["output"]


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "Parser key \"data.batch_size\":\n  Expected a <class 'int'>. Got value: abc",
            "--data.batch_size=abc is not an integer. Fix: correct the value of --data.batch_size",
        ),
        (
            'Parser key "data.interpolation":\n  Does not validate against any of the Union subtypes\n'
            "  Subtypes: [typing.Literal['bilinear', 'bicubic'], <class 'NoneType'>]\n  Errors:\n"
            "    - Expected a typing.Literal['bilinear', 'bicubic']\n    - Expected a <class 'NoneType'>\n"
            "  Given value type: <class 'str'>\n  Given value: nearest",
            "--data.interpolation=nearest is not one of 'bilinear', 'bicubic' or null. Fix: correct",
        ),
        (
            "argument --workers: invalid int value: 'abc'",
            "--workers 'abc' is not an integer. Fix: give --workers an",
        ),
        (
            "unrecognized arguments: --worker 3",
            "python -m project infer does not take --worker 3. Fix: did you mean --workers?",
        ),
        (
            "the following arguments are required: --folders",
            "Missing from the command line: --folders (needed by python -m project infer). "
            "Fix: pass --folders",
        ),
        (
            "argument --model: expected one argument",
            "--model is given without its value. Fix: pass --model=VALUE",
        ),
    ],
)
def test_parser_messages_become_one_line_naming_the_option(message: str, expected: str) -> None:
    error = usage_error(message, "python -m project infer", ["--workers", "--folders", "--help"])
    assert str(error).startswith(expected) and "\n" not in str(error)


def test_every_install_advice_comes_from_one_helper() -> None:
    """An optional package's `pip install -e '.[extra]'` is written in errors.install_hint only, so every
    message says it the same way (messages, not docstrings)."""
    package = Path(project.__file__).parent
    written = []
    for path in sorted(package.rglob("*.py")):
        if "template" in path.relative_to(package).parts or path.name == "errors.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(ast.get_docstring(node, clean=False) and node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        }
        written += [
            f"{path.relative_to(package)}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and re.search(r"pip install (-e )?'?\.\[|pip install \w", node.value)
            and "--index-url" not in node.value  # a CUDA build of torch: not an extra of the project
        ]
    assert written == []
