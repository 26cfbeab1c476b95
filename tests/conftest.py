"""Shared fixtures: tiny real image folders made in the test, and an empty working folder.

Functions the tests call (the in-process CLI runner, tiny trainers, ...) live in tests/helpers.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING  # room: api

import pytest
import setuptools  # noqa: F401  (before anything imports distutils: torch.compile's build needs setuptools' own)
import torch

from project.data.shapes import generate_shapes
from tests.helpers import write_colours

# pytest-xdist runs the suite on 2 workers (pyproject's addopts), one per core of a CI machine: each
# worker, and each command it starts, computes on one thread, not on all cores against the other worker
if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    torch.set_num_threads(1)

# room: api begin
if TYPE_CHECKING:
    from project.api import Run

# room: api end


@pytest.fixture(scope="session")
def shapes_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train/ and val/ of the embedded shapes: 6 classes, 8 + 4 JPEGs each, 32x32."""
    return generate_shapes(tmp_path_factory.mktemp("data") / "shapes", 8, 4, image_size=32)


@pytest.fixture(scope="session")
def colours_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data set a fit of 6 steps learns (tests.helpers.write_colours): for what needs a model that is
    not at chance (calibration, the unknown threshold)."""
    return write_colours(tmp_path_factory.mktemp("data") / "colours")


@pytest.fixture
def flat_root(tmp_path: Path, shapes_root: Path) -> Path:
    """One folder of class sub-folders (no train/val), for --data.val_split."""
    root = tmp_path / "flat"
    shutil.copytree(shapes_root / "train", root)
    return root


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder: logs/ and checkpoints/ are relative to it."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


# room: api begin
@pytest.fixture(scope="session")
def fitted_run(tmp_path_factory: pytest.TempPathFactory, shapes_root: Path) -> Run:
    """One tiny fit through the Python API (resnet18, 32 px, 1 epoch) with its end-of-fit ONNX export,
    for the tests that predict with a checkpoint or an export. Its logs/ and checkpoints/ lie in a folder
    of its own; the working folder is the test's again once it is trained (the Run's paths are absolute)."""
    from project import api
    from tests.helpers import fast_args

    work = tmp_path_factory.mktemp("fitted-run")
    saved = Path.cwd()
    os.chdir(work)
    try:
        return api.fit(*fast_args(shapes_root), "--export_best.enabled=true", "--name=fitted")
    finally:
        os.chdir(saved)


# room: api end
