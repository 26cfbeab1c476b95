"""Installed, not only cloned: `pip install .` (not editable), run from another folder.

The package is built from a copy of this checkout (the build writes into the tree it builds from)
and installed with pip's --target into a folder of its own; its dependencies come from this
environment. Commands run with that folder as the only PYTHONPATH entry and a working folder that
has no configs/: the default config must apply, and every subcommand must start through both
`python -m project` and the installed `project` script.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from project.__main__ import COMMANDS as DISPATCHED
from project.cli import ProjectCLI
from tests.helpers import fast_args

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# every command: LightningCLI's subcommands and those __main__ dispatches itself (a new one is covered)
COMMANDS = (*ProjectCLI.subcommands(), *DISPATCHED)
# folders of a working checkout that are not part of the package's sources
NOT_SOURCES = {".git", ".venv", "logs", "checkpoints", "data", "build", "dist"}

# runs `<launcher> <command> --help` for each command in one process (a Lightning import is seconds);
# the launcher is `-m` (python -m project) or the path of the installed script
HELP_DRIVER = """
import contextlib, io, json, re, runpy, sys
launcher, commands = sys.argv[1], sys.argv[2:]
results = {}
for command in commands:
    sys.argv = ["project", command, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            if launcher == "-m":
                runpy.run_module("project", run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(launcher, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:
        code = 1
        out.write(f"{type(e).__name__}: {e}")
    text = out.getvalue()
    shown = text if len(text) < 4000 else text[:2000] + " ... " + text[-2000:]  # usage and the error
    # a room's marker inside a docstring that jsonargparse reads would be shown as help
    markers = [line.strip() for line in text.splitlines() if re.search(r"(#|<!--) *room:", line)]
    results[command] = {"code": code, "output": shown, "markers": markers}
import project
print(json.dumps({"file": project.__file__, "results": results}))
"""


def _not_sources(folder: str, names: list[str]) -> list[str]:
    top = Path(folder) == REPO
    return [n for n in names if n == "__pycache__" or n.endswith(".egg-info") or (top and n in NOT_SOURCES)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip install --no-deps --target SITE .` of a copy of this checkout; returns SITE."""
    for tool in ("pip", "setuptools"):
        if importlib.util.find_spec(tool) is None:
            pytest.skip(f"building the package needs {tool} in this environment")
    base = tmp_path_factory.mktemp("installed")
    source, site = base / "source", base / "install" / "site"
    shutil.copytree(REPO, source, ignore=_not_sources, symlinks=True)
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
    command += ["--quiet", "--target", str(site), "."]
    done = subprocess.run(command, cwd=source, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return site


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty working folder: no configs/, no src/."""
    return tmp_path_factory.mktemp("elsewhere")


def run(site: Path, cwd: Path, *command: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not the checkout's src/
    env["PYTHONPATH"] = str(site)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def launchers(site: Path) -> dict[str, list[str]]:
    return {
        "python -m project": [sys.executable, "-m", "project"],
        "project": [str(site / "bin" / "project")],
    }


@pytest.mark.parametrize("launcher", ["python -m project", "project"])
def test_the_default_config_applies(installed: Path, elsewhere: Path, launcher: str) -> None:
    default = yaml.safe_load((REPO / "configs" / "default.yaml").read_text())
    done = run(installed, elsewhere, *launchers(installed)[launcher], "fit", "--print_config")
    assert done.returncode == 0, done.stderr
    shown = yaml.safe_load(done.stdout)
    assert shown["seed_everything"] == default["seed_everything"]
    assert shown["model"]["backbone"] == default["model"]["backbone"]
    assert shown["model"]["bn_momentum"] == default["model"]["bn_momentum"]
    assert shown["data"]["image_size"] == default["data"]["image_size"]
    assert shown["trainer"]["max_epochs"] == default["trainer"]["max_epochs"]


@pytest.fixture(scope="module")
def helps(installed: Path, elsewhere: Path) -> dict[str, dict]:
    """launcher -> {"file": project.__file__, "results": {command: {"code", "output"}}}."""
    found = {}
    for name, launcher in (("python -m project", "-m"), ("project", str(installed / "bin" / "project"))):
        done = run(installed, elsewhere, sys.executable, "-c", HELP_DRIVER, launcher, *COMMANDS)
        assert done.returncode == 0, done.stderr
        found[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_installed_package_is_the_one_imported(installed: Path, helps: dict[str, dict]) -> None:
    for launcher, found in helps.items():
        assert Path(found["file"]).is_relative_to(installed), (launcher, found["file"])


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("launcher", ["python -m project", "project"])
def test_every_subcommand_starts(helps: dict[str, dict], launcher: str, command: str) -> None:
    result = helps[launcher]["results"][command]
    assert result["code"] == 0, result["output"]
    assert "usage:" in result["output"].lower(), result["output"]
    assert result["markers"] == []


def tree(root: Path) -> dict[str, bytes | str]:
    """Every file under `root` (links as their target), without git's own folder."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        if path.is_symlink():
            found[rel] = os.readlink(path)
        elif path.is_file():
            found[rel] = path.read_bytes()
    return found


# room: new begin
@pytest.fixture(scope="module")
def checkout_clone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes | str]:
    """What `new` makes from this checkout: the installed package must make the same."""
    from project import new

    dest = tmp_path_factory.mktemp("from-checkout") / "leaf"
    new.create(dest, "leafnet")
    return tree(dest)


@pytest.mark.parametrize("launcher", ["python -m project", "project"])
def test_new_from_the_installed_package_makes_the_checkout_clone(
    installed: Path, elsewhere: Path, checkout_clone: dict, tmp_path: Path, launcher: str
) -> None:
    """The README's promise: the installed script runs every command, `new` included, from any folder."""
    dest = tmp_path / "leaf"
    done = run(installed, elsewhere, *launchers(installed)[launcher], "new", str(dest), "--name", "leafnet")
    assert done.returncode == 0, done.stderr
    assert "Created leafnet" in done.stdout
    made = tree(dest)
    assert sorted(made) == sorted(checkout_clone)
    assert [rel for rel in made if made[rel] != checkout_clone[rel]] == []
    assert os.access(dest / ".ci" / "run", os.X_OK)
    assert os.readlink(dest / "src" / "leafnet" / "configs") == "../../configs"


# room: new end
def test_the_readme_preset_paths_work_from_another_folder(installed: Path, elsewhere: Path) -> None:
    """`--config configs/presets/debug.yaml` as the README writes it: the package's own configs/."""
    done = run(
        installed,
        elsewhere,
        *launchers(installed)["project"],
        "fit",
        "--config",
        "configs/presets/debug.yaml",
        "--print_config",
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["trainer"]["fast_dev_run"] == 5


# the module each optional package of pyproject's extras is imported as (a new extra adds its rows)
EXTRA_MODULES = {
    "fastapi": "fastapi",  # room: serve
    "uvicorn": "uvicorn",  # room: serve
    "httptools": "httptools",  # room: serve
    "uvloop": "uvloop",  # room: serve
    "python-multipart": "multipart",  # room: serve
    "optuna": "optuna",  # room: sweep
    "psycopg2-binary": "psycopg2",  # room: sweep
    "cleanlab": "cleanlab",  # room: audit
    "grad-cam": "pytorch_grad_cam",  # room: explain
    "openvino": "openvino",  # room: openvino
    "timm": "timm",  # room: timm
    "huggingface_hub": "huggingface_hub",  # room: timm
    "litdata": "litdata",  # room: shards
    "boto3": "boto3",  # room: shards
    "mlflow-skinny": "mlflow",  # room: trackers
    "wandb": "wandb",  # room: trackers
}


@pytest.mark.slow
def test_the_core_fits_exports_and_infers_without_any_extra(workdir: Path, shapes_root: Path) -> None:
    """The README's first command installs the core alone (`pip install -e .`): fit, its export and infer
    run with every extra's package unimportable, as in that environment."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = {re.split(r"[<>=\[; ]", r)[0] for name, reqs in extras.items() if name != "dev" for r in reqs}
    assert wanted == set(EXTRA_MODULES)  # a new extra's package gets its module here
    blocked = sorted(EXTRA_MODULES.values())
    script = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None  # import raises ImportError, as uninstalled\n"
        "from project.__main__ import main\n"
        "sys.argv = ['project', *sys.argv[1:]]\n"
        "main()\n"
    )
    fit = [*fast_args(shapes_root, "--name=core"), "--export_best.enabled=true"]
    done = subprocess.run(
        [sys.executable, "-c", script, "fit", *fit], cwd=workdir, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    model = workdir / "checkpoints" / "core" / "latest.onnx"
    assert model.is_file()
    images = sorted((shapes_root / "val").rglob("*.jpg"))[:3]
    done = subprocess.run(
        [sys.executable, "-c", script, "infer", "--model", str(model), *map(str, images)],
        cwd=workdir,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [
        line.split("\t") for line in done.stdout.strip().splitlines()
    ]  # a line per image: its top classes
    assert [row[0] for row in rows] == list(map(str, images)) and all(len(row) > 1 for row in rows)
