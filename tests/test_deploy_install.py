"""The serving install (deploy/): the torch-free package, installed alone into a fresh environment.

deploy/src/<package> links the modules of src/<package> that `infer` and `serve` need. The fast tests run
those links from the checkout (every deploy module imports with them alone; its dependencies are the
training package's with its `serve` extra, with the same bounds); the slow one installs deploy/ as
deploy/Dockerfile does into a new virtual environment (pip from the configured index), checks that torch
is absent, and serves a request.
"""

from __future__ import annotations

import os
import pkgutil
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from PIL import Image

from project import deploy
from project.deploy.classifier import Classifier
from tests.exports import encode, point_latest, tiny_export
from tests.servers import predict

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PACKAGE = deploy.__name__.partition(".")[0]
DOCKERFILE = DEPLOY / "Dockerfile"
LOCK = DEPLOY / "requirements.lock"
# what the base image the Dockerfile pins holds to build the package with (--no-build-isolation); a
# new venv of Python 3.11 has setuptools 65.5 without wheel, which cannot build a wheel
BASE_IMAGE_BUILD_TOOLS = ["setuptools==79.0.1", "wheel==0.46.3"]
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
    training = tomllib.loads((REPO / "pyproject.toml").read_text())
    core, extras = training["project"]["dependencies"], training["project"]["optional-dependencies"]
    assert set(serving) <= {*core, *extras["serve"]}
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


def pip_installs(dockerfile: str) -> list[list[str]]:
    """The `python -m pip install ...` commands of the Dockerfile's RUN instructions, as argument lists."""
    joined = re.sub(r"\\\n", " ", dockerfile)  # continuation lines
    runs = [line[4:] for line in joined.splitlines() if line.startswith("RUN ")]
    commands = [shlex.split(part) for run in runs for part in run.split("&&")]
    return [c for c in commands if c[:4] == ["python", "-m", "pip", "install"]]


def locked(lock: str) -> dict[str, tuple[str, list[str], list[str]]]:
    """{name: (version, hashes, what it is there for)} of a requirements lock with hashes and `# via`."""
    entries: dict[str, tuple[str, list[str], list[str]]] = {}
    name = ""
    for line in lock.splitlines():
        if found := re.match(r"([A-Za-z0-9._-]+)==([^\s;\\]+)", line):
            name = canonicalize_name(found.group(1))
            entries[name] = (found.group(2), [], [])
        elif found := re.search(r"--hash=(sha256:[0-9a-f]{64})", line):
            entries[name][1].append(found.group(1))
        elif name and (why := line.strip().lstrip("#").strip().removeprefix("via").strip()):
            entries[name][2].append(why)  # `# via NAME`, or `# via` then `#   NAME` lines
    return entries


def test_the_serving_image_is_pinned_by_digest_and_installs_its_lock_with_hashes() -> None:
    """deploy/Dockerfile's base is a digest and its dependencies come from deploy/requirements.lock only,
    hash-checked; the lock holds exactly deploy/pyproject.toml's dependencies, within their bounds."""
    dockerfile = DOCKERFILE.read_text()
    base = re.search(r"^FROM python:(\d+\.\d+)-slim@sha256:[0-9a-f]{64}$", dockerfile, re.MULTILINE)
    assert base, "the base image is pinned by tag only"
    lock_install, package_install = pip_installs(dockerfile)
    assert {"--require-hashes", "--only-binary=:all:"} <= set(lock_install), lock_install
    assert lock_install[lock_install.index("-r") + 1] == "deploy/requirements.lock"
    assert "--no-deps" in package_install and package_install[-1] == "./deploy", package_install

    lock = LOCK.read_text()
    generated_by = re.search(r"^#\s+uv pip compile .*$", lock, re.MULTILINE)
    assert generated_by and "--generate-hashes" in generated_by.group(0)
    assert f"--python-version {base.group(1)} " in generated_by.group(0)  # the image's Python
    assert "--python-platform x86_64-unknown-linux-gnu" in generated_by.group(0)
    entries = locked(lock)
    assert all(hashes for _, hashes, _ in entries.values()), "a locked package without hashes"
    tomllib = pytest.importorskip("tomllib")
    declared = [
        Requirement(r)
        for r in tomllib.loads((DEPLOY / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    image = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    image |= {"python_version": base.group(1), "implementation_name": "cpython"}
    wanted = {canonicalize_name(r.name): r for r in declared if r.marker is None or r.marker.evaluate(image)}
    top_level = {
        name for name, (_, _, via) in entries.items() if "project-deploy (deploy/pyproject.toml)" in via
    }
    assert top_level == set(wanted), "deploy/requirements.lock is out of date: regenerate it (docs/deploy.md)"
    for name, requirement in wanted.items():
        version = entries[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{name}=={version} vs {requirement}"
        )


def copy_sources(build: Path) -> None:
    """src/<package> and deploy/ side by side, links kept: what deploy/Dockerfile copies."""
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(REPO / "src" / PACKAGE, build / "src" / PACKAGE, symlinks=True, ignore=skip)
    shutil.copytree(DEPLOY, build / "deploy", symlinks=True, ignore=skip)


@pytest.fixture(scope="module")
def serving_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment, installed by deploy/Dockerfile's own pip commands; returns its bin/."""
    base = tmp_path_factory.mktemp("serving")
    copy_sources(base / "build")
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True, timeout=120)
    python = base / "venv" / "bin" / "python"
    image = [["python", "-m", "pip", "install", "--quiet", *BASE_IMAGE_BUILD_TOOLS]]
    for command in image + pip_installs(DOCKERFILE.read_text()):
        command = [str(python), *command[1:], "--quiet"]
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
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its own package, not this checkout
    fit = subprocess.run(
        [str(serving_env / PACKAGE), "fit"], capture_output=True, text=True, cwd=tmp_path, env=alone
    )
    assert fit.returncode == 2 and "is not part of this install" in fit.stderr
