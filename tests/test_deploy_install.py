"""The serving install (deploy/): the torch-free package, installed alone into a fresh environment.

deploy/src/<package> links the modules of src/<package> that `infer` and `serve` need. The fast tests run
those links from the checkout (every deploy module imports with them alone; its dependencies are the
training package's, with the same bounds); the slow one installs deploy/ as deploy/Dockerfile does into a
new virtual environment (pip from the configured index), checks that torch is absent, and serves a request.
"""

from __future__ import annotations

import os
import pkgutil
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from PIL import Image

from project import deploy
from project.deploy.classifier import Classifier
from tests.test_serve import encode, point_latest, predict, tiny_export

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PACKAGE = deploy.__name__.partition(".")[0]
TRAINING_ONLY = {"torch", "torchvision", "lightning", "torchmetrics", "onnx", "onnxscript"}

pytestmark = pytest.mark.skipif(not DEPLOY.is_dir(), reason="this copy of the template has no deploy/")


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_serving_package_holds_every_module_deploy_imports() -> None:
    """With deploy/src first on the path, every project.deploy module imports from the links alone."""
    names = [info.name for info in pkgutil.walk_packages(deploy.__path__, f"{deploy.__name__}.")]
    probe = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sys.modules[{PACKAGE!r}].__file__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(DEPLOY / "src")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=DEPLOY)
    assert done.returncode == 0, done.stderr  # a ModuleNotFoundError names the module to link
    assert done.stdout.strip() == str(DEPLOY / "src" / PACKAGE / "__init__.py")


def test_a_training_command_in_the_serving_package_is_one_message() -> None:
    env = {**os.environ, "PYTHONPATH": str(DEPLOY / "src")}
    done = subprocess.run(
        [sys.executable, "-m", PACKAGE, "fit"], capture_output=True, text=True, env=env, cwd=DEPLOY
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: `fit` is not part of this install, which runs only `infer` and ")
    assert "Fix: install the training package" in done.stderr and "Traceback" not in done.stderr


def test_the_serving_dependencies_are_the_training_package_s_with_the_same_bounds() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    serving = tomllib.loads((DEPLOY / "pyproject.toml").read_text())["project"]["dependencies"]
    training = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert set(serving) <= set(training)
    assert requirement_names(serving) == {
        "numpy",
        "pillow",
        "onnxruntime",
        "fastapi",
        "uvicorn",
        "httptools",
        "uvloop",
        "python-multipart",
    }


def copy_sources(build: Path) -> None:
    """src/<package> and deploy/ side by side, links kept: what deploy/Dockerfile copies."""
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(REPO / "src" / PACKAGE, build / "src" / PACKAGE, symlinks=True, ignore=skip)
    shutil.copytree(DEPLOY, build / "deploy", symlinks=True, ignore=skip)


@pytest.fixture(scope="module")
def serving_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment, `pip install ./deploy` as deploy/Dockerfile runs it; returns its bin/."""
    base = tmp_path_factory.mktemp("serving")
    copy_sources(base / "build")
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True, timeout=120)
    python = base / "venv" / "bin" / "python"
    command = [str(python), "-m", "pip", "install", "--no-cache-dir", "--quiet", "./deploy"]
    done = subprocess.run(command, cwd=base / "build", capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return python.parent


@contextmanager
def serving(bin_dir: Path, model: Path, log: Path) -> Iterator[int]:
    """`project serve --model MODEL --port 0` of the serving environment (its own script, not this
    checkout: no PYTHONPATH); yields the port it listens on, and stops it with SIGTERM."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [str(bin_dir / PACKAGE), "serve", "--model", str(model), "--port", "0"]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"http://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        yield int(found.group(1))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.mark.slow
def test_the_serving_install_has_no_torch_and_serves_an_export(serving_env: Path, tmp_path: Path) -> None:
    listed = subprocess.run(
        [str(serving_env / "python"), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    )
    installed = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert {"onnxruntime", "fastapi", "uvicorn", "numpy", "pillow"} <= installed
    assert installed & TRAINING_ONLY == set(), installed & TRAINING_ONLY
    models = tmp_path / "models"
    models.mkdir()
    tiny_export(models, "run-a", seed=0)
    point_latest(models, "run-a")
    image = tmp_path / "blue.jpg"
    image.write_bytes(encode(Image.new("RGB", (40, 30), (30, 20, 230))))
    expected = next(iter(Classifier(models / "latest.onnx").classify([image], top_k=4)))  # this checkout
    with serving(serving_env, models / "latest.onnx", tmp_path / "serve.log") as port:
        status, answer = predict(port, image.read_bytes())
    assert status == 200, answer
    assert answer["version"] == "run-a"
    names = [p["class_name"] for p in answer["predictions"]]
    assert names == expected[1] and names[0] == "blue"
    fit = subprocess.run([str(serving_env / PACKAGE), "fit"], capture_output=True, text=True, cwd=tmp_path)
    assert fit.returncode == 2 and "is not part of this install" in fit.stderr
