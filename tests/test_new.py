"""`python -m project new`: a renamed, committed copy that passes its own tests; mistakes write nothing."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from project import new
from project.errors import UserError

OLD = new.PACKAGE
# the clone runs a fast subset of its own suite (its test_new without this clone-and-run test)
# a full copy's own tests of the renamed package; the core copy runs its whole fast lane (tests/test_rooms.py)
CLONE_TESTS = ("tests/test_index.py", "tests/test_shapes.py", "tests/test_new.py", "-m", "not slow")
FAST_DEV_RUN = (
    "--trainer.fast_dev_run=true",
    "--data.image_size=32",
    "--data.batch_size=8",
    "--data.num_workers=0",
)


def run_new(*args: str) -> int:
    try:
        new.main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    return 0


@pytest.mark.slow
def test_clone_is_renamed_committed_and_passes_its_tests(tmp_path: Path, shapes_root: Path) -> None:
    dest = tmp_path / "work" / "leaf"
    assert run_new(str(dest), "--name", "leafnet") == 0
    assert sorted(p.name for p in dest.parent.iterdir()) == ["leaf"]  # no staging folder left behind
    assert (dest / "src" / "leafnet" / "cli.py").is_file() and not (dest / "src" / OLD).exists()
    for kept in (".ci/run", "README.md", "pyproject.toml", "configs/default.yaml", "tests/conftest.py"):
        assert (dest / kept).is_file(), kept
    assert os.access(dest / ".ci" / "run", os.X_OK)
    # the link that ships configs/ in the package stays a link (a copy would drift from configs/)
    assert os.readlink(dest / "src" / "leafnet" / "configs") == "../../configs"
    assert sorted(p.name for p in (dest / "logs").iterdir()) == [".gitkeep"]
    assert sorted(p.name for p in (dest / "checkpoints").iterdir()) == [".gitkeep"]
    for absent in ("data", ".venv", ".pytest_cache", ".ruff_cache"):
        assert not (dest / absent).exists(), absent
    assert not list(dest.rglob("__pycache__")) and not list(dest.rglob("*.egg-info"))
    assert new.leftovers(dest, OLD) == []
    assert 'name = "leafnet"' in (dest / "pyproject.toml").read_text()
    assert "[project.scripts]" in (dest / "pyproject.toml").read_text()  # TOML tables keep their name
    assert "class_path: leafnet.schedulers.WarmupCosineLR" in (dest / "configs/default.yaml").read_text()
    readme = (dest / "README.md").read_text()
    assert ".venv/bin/python -m leafnet fit" in readme and ".venv/bin/python -m pytest" in readme
    if shutil.which("git"):
        log = subprocess.run(["git", "log", "--format=%s"], cwd=dest, capture_output=True, text=True)
        assert log.stdout.splitlines() == ["Start leafnet"]
        status = subprocess.run(["git", "status", "--porcelain"], cwd=dest, capture_output=True, text=True)
        assert status.stdout == ""  # everything copied is committed

    env = {**os.environ, "PYTHONPATH": str(dest / "src")}
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *CLONE_TESTS],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
    )
    assert tests.returncode == 0, tests.stdout[-2000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout
    fit = subprocess.run(
        [sys.executable, "-m", "leafnet", "fit", f"--data.root={shapes_root}", *FAST_DEV_RUN],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert "Running in `fast_dev_run` mode" in fit.stdout + fit.stderr


# room: timm begin
@pytest.mark.slow
def test_a_clone_trains_a_timm_backbone(tmp_path: Path, shapes_root: Path) -> None:
    dest = tmp_path / "leaf"
    new.create(dest, "leafnet")
    backbone = "timm/test_efficientnet"  # timm's test EfficientNet: 0.1 M parameters, from scratch
    flags = [
        f"--data.root={shapes_root}",
        "--name=t",
        "--trainer.max_epochs=1",
        "--export_best.enabled=false",
    ]
    flags += [f"--model.backbone={backbone}", "--model.weights=null", "--trainer.limit_train_batches=2"]
    env = {**os.environ, "PYTHONPATH": str(dest / "src"), "OMP_NUM_THREADS": "1"}
    fit = subprocess.run(
        [sys.executable, "-m", "leafnet", "fit", *flags, *FAST_DEV_RUN[1:]],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    import torch

    saved = torch.load(dest / "checkpoints" / "t" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["hyper_parameters"]["backbone"] == backbone and saved["global_step"] == 2
    assert saved["hyper_parameters"]["scheduler"]["class_path"] == "leafnet.schedulers.WarmupCosineLR"
    assert saved["state_dict"]["net.classifier.weight"].shape[0] == 6  # timm's head, for the 6 shapes
    assert saved["pretrained_config"]["tag"] == "r160_in1k"


# room: timm end


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("2fast", "is not a valid Python package name"),
        ("my-task", "is not a valid Python package name"),
        ("class", "is not a valid Python package name"),
        ("json", "standard library"),
        ("torch", "already importable"),
        ("tests", "is a folder of the template"),
        ("ñame", "is not a valid Python package name"),  # not ASCII: not a TOML bare key, not PEP 508
        ("__init__", "is not a valid Python package name"),
        ("_private", "is not a valid Python package name"),  # PEP 508: starts and ends with a letter/digit
        ("task_", "is not a valid Python package name"),
    ],
)
def test_a_bad_name_writes_nothing(tmp_path: Path, capsys, name: str, message: str) -> None:
    assert run_new(str(tmp_path / "dest"), "--name", name) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --name '{name}'") and message in err and "Fix:" in err
    assert list(tmp_path.iterdir()) == []


def test_a_non_empty_destination_writes_nothing(tmp_path: Path, capsys) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep me")
    afile = tmp_path / "a-file"
    afile.write_text("")
    for target in (dest, afile):
        assert run_new(str(target), "--name", "leafnet") == 2
        assert f"'{target}' already exists and is not an empty folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "dest"]
    assert [p.name for p in dest.iterdir()] == ["mine.txt"]


def test_an_empty_destination_folder_is_filled(tmp_path: Path) -> None:
    dest = tmp_path / "empty"
    dest.mkdir()
    count, _ = new.create(dest, "leafnet")
    assert count > 20 and (dest / "src" / "leafnet" / "__init__.py").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


# room: notebooks begin
def test_the_notebooks_are_cloned_renamed(tmp_path: Path) -> None:
    """The clone's notebooks import and run its own package (`from petalnet import api`), not this one.

    Not named leafnet: the clone that test_clone_is_renamed_committed_and_passes_its_tests makes runs this
    test too, and its own package is leafnet."""
    import nbformat

    new.create(tmp_path / "clone", "petalnet")
    for name in ("quickstart", "your_images"):
        notebook = nbformat.read(tmp_path / "clone" / "notebooks" / f"{name}.ipynb", as_version=4)
        nbformat.validate(notebook)
        code = "\n".join(cell.source for cell in notebook.cells)
        assert "from petalnet import api" in code and "from petalnet.data.shapes import" in code
        assert not re.search(rf"\b{OLD}\.|import {OLD}\b|from {OLD}\b|-m {OLD}\b", code)


# room: notebooks end


def test_outside_git_the_tree_is_walked_with_exclusions(tmp_path: Path) -> None:
    root = tmp_path / "template"
    keep = [
        "pyproject.toml",
        "src/old_pkg/__init__.py",
        "src/old_pkg/logo.png",
        "configs/a.yaml",
        "logs/.gitkeep",
        "checkpoints/.gitkeep",
    ]
    drop = [
        ".git/HEAD",
        ".venv/bin/python",
        "venv/x",
        "logs/run/events.out",
        "checkpoints/run/last.ckpt",
        "data/shapes/train/a.jpg",
        "src/old_pkg/__pycache__/x.pyc",
        "src/old_pkg.egg-info/PKG-INFO",
        "model.onnx",
        "exports/model.pt2",
        ".pytest_cache/v",
        ".ruff_cache/v",
        "build/lib/x.py",
    ]
    for rel in keep + drop:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("from old_pkg import x\n")
    (root / "src/old_pkg/logo.png").write_bytes(b"\x89PNG\xff\xfe old_pkg")
    (root / "pyproject.toml").write_text(
        '[project]\nname = "old_pkg"\n[project.scripts]\nold_pkg = "old_pkg.cli:main"\n'
    )
    assert new.template_files(root) == sorted(keep)

    new.create(tmp_path / "copy", "fresh", root=root, old="old_pkg")
    copy = tmp_path / "copy"
    assert (copy / "src/fresh/__init__.py").read_text() == "from fresh import x\n"
    assert (copy / "src/fresh/logo.png").read_bytes() == b"\x89PNG\xff\xfe old_pkg"  # binary: as it was
    toml = (copy / "pyproject.toml").read_text()
    assert toml == '[project]\nname = "fresh"\n[project.scripts]\nfresh = "fresh.cli:main"\n'


def test_renaming_targets_code_references_not_prose() -> None:
    rules = new.renamer(OLD, "zz_fresh")
    code = (
        "from {0}.data import x\nimport {0}\nclass_path: {0}.schedulers.WarmupCosineLR\n"
        "python -m {0} fit\nsrc/{0}/cli.py\nrunpy.run_module('{0}')\n"
    )
    prose = "A checkpoint of this project.\n[project.optional-dependencies]\nmy_{0}.x\nPROJECT_RUN_NAME\n"
    text = (code + prose).format(OLD)
    assert new.rename_text(text, rules) == code.format("zz_fresh") + prose.format(OLD)


def _template(root: Path) -> Path:
    """A minimal template (package old_pkg) at `root`."""
    for rel in ("pyproject.toml", "src/old_pkg/__init__.py", "README.md"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("from old_pkg import x\n")
    return root


@pytest.mark.parametrize("inside", ["nested", "src/old_pkg/copy"])
def test_a_destination_inside_the_template_writes_nothing(tmp_path: Path, inside: str) -> None:
    root = _template(tmp_path / "template")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with pytest.raises(UserError, match=r"Destination '.*' is inside the template '.*'; nothing was written"):
        new.create(root / inside, "fresh", root=root, old="old_pkg")
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


@pytest.mark.skipif(
    shutil.which("git") is None or not (new.TEMPLATE_ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_only_tracked_files_are_copied_with_their_working_tree_content(tmp_path: Path) -> None:
    """Stray outputs lying in a clone (a log, notes) stay behind; uncommitted edits of tracked files go."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(new.TEMPLATE_ROOT), str(clone)], check=True)
    (clone / "fit.log").write_text("Epoch 3: loss 0.1\n")
    (clone / "configs" / "notes.yaml").write_text("mine: true\n")
    (clone / "README.md").write_text((clone / "README.md").read_text() + "\nA local edit.\n")
    (clone / "docs" / "troubleshooting.md").unlink()  # a tracked file deleted in the working tree
    files = new.template_files(clone)
    assert "fit.log" not in files and "configs/notes.yaml" not in files
    assert "docs/troubleshooting.md" not in files and "README.md" in files
    tracked = subprocess.run(["git", "ls-files"], cwd=clone, capture_output=True, text=True, check=True)
    assert set(files) <= set(tracked.stdout.splitlines())

    count, _ = new.create(tmp_path / "copy", "stray_check", root=clone)
    copy = tmp_path / "copy"
    assert count == len(files)
    assert not (copy / "fit.log").exists() and not (copy / "configs" / "notes.yaml").exists()
    assert (copy / "README.md").read_text().endswith("\nA local edit.\n")
    assert (copy / "src" / "stray_check" / "__init__.py").is_file()


def doc_example_names() -> list[str]:
    """The names the README and docs/new-task.md pass to `new` in their examples."""
    docs = [new.TEMPLATE_ROOT / "README.md", new.TEMPLATE_ROOT / "docs" / "new-task.md"]
    return sorted({m for doc in docs for m in re.findall(r" new \S+ --name ([a-z]\w*)", doc.read_text())})


@pytest.mark.parametrize("name", doc_example_names())
def test_a_clone_named_as_in_the_docs_copies_itself_cleanly(tmp_path: Path, name: str) -> None:
    """What the clone's own test_new does: copy it again, and find no leftover of its name; the copy is
    an ordinary folder (the umask's mode), not a private one."""
    assert len(doc_example_names()) >= 2
    if name != OLD and importlib.util.find_spec(name) is not None:
        # inside the clone-of-a-clone test of a clone named like the docs: that clone is installed here,
        # so `new` rightly refuses its name (the clone's own run of this test made it)
        pytest.skip(f"'{name}' is an installed package in this environment")
    mask = os.umask(0o022)
    try:
        clone = tmp_path / name
        new.create(clone, name)
    finally:
        os.umask(mask)
    assert stat.S_IMODE(clone.stat().st_mode) == 0o755
    again = tmp_path / "again"
    new.create(again, f"{name}_again", root=clone, old=name)  # not this package's name, in any clone
    assert new.leftovers(again, name) == []
    assert (
        "--name " + name in (again / "README.md").read_text() + (again / "docs" / "new-task.md").read_text()
    )


def test_an_installed_copy_puts_back_the_checkout_it_came_from(tmp_path: Path) -> None:
    """What a wheel holds (the package with its links followed) gives back the checkout's files and links;
    tests/test_installed.py runs `new` from a real installation."""
    installed = tmp_path / "site" / OLD
    shutil.copytree(
        new.PACKAGE_DIR, installed, ignore=shutil.ignore_patterns("__pycache__")
    )  # links followed
    with new.installed_template(installed) as root:
        files = new.template_files(root)
        links = {rel: os.readlink(root / rel) for rel in files if (root / rel).is_symlink()}
        assert files == new.template_files(new.TEMPLATE_ROOT)
        assert (root / ".gitignore").read_text() == (new.TEMPLATE_ROOT / ".gitignore").read_text()
    assert links[f"src/{OLD}/configs"] == "../../configs"
    assert links[f"src/{OLD}/template/gitignore"] == "../../../.gitignore"


def test_an_installed_copy_without_the_template_says_how_to_get_it(tmp_path: Path) -> None:
    message = r"has no template to copy .* Fix: reinstall it from a checkout"
    with pytest.raises(UserError, match=message), new.installed_template(tmp_path):
        pass


def test_the_next_commands_quote_the_destination(tmp_path: Path, capsys) -> None:
    dest = tmp_path / "my task; touch pwned"
    assert run_new(str(dest), "--name", "leafnet") == 0
    out = capsys.readouterr().out
    assert f"  cd '{dest}' && python3 -m venv .venv" in out  # one argument of cd, not a second command
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("dest", "message"),
    [
        ("d" * 300, "has a part of 300 bytes ('dddd"),
        ("link", "is a link (to 'empty'); nothing was written. Fix: pass the folder it points to"),
        ("/proc/self/new-task", "Cannot create '/proc/self/new-task': No such file or directory"),
        ("/proc/self/a/new-task", "Cannot create '/proc/self/a/new-task': No such file or directory"),
    ],
)
def test_a_destination_the_system_refuses_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, dest: str, message: str
) -> None:
    """Too long a name, a link to an empty folder, a file system that takes no folder: one line each."""
    if dest.startswith("/proc/") and not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to("empty")
    assert run_new(dest, "--name", "leafnet") == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ") and message in line and " Fix: " in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "link"]
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_name_too_long_for_a_file_name_is_one_error_line(tmp_path: Path, capsys) -> None:
    assert run_new(str(tmp_path / "dest"), "--name", "a" * 5000) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: --name '{'a' * 40}...' is 5,000 characters long; a package name may")
    assert " Fix: pick a shorter name" in line and len(line) < 300
    assert list(tmp_path.iterdir()) == []


def test_renaming_keeps_pyprojects_project_table_read_as_a_dict() -> None:
    from project.new import rename_text, renamer

    rules = renamer("project", "my_task")
    table = 'tomllib.loads(text)["project"]["dependencies"]'
    assert rename_text(table, rules) == table  # the PEP 621 table keeps its name in every pyproject
    extras = 'tomllib.loads(text)["project"]["optional-dependencies"]'
    assert rename_text(extras, rules) == extras
    assert rename_text('launchers(installed)["project"]', rules) == 'launchers(installed)["my_task"]'
    assert rename_text("name = 'project'", rules) == "name = 'my_task'"
