"""How the code is laid out: conventions that keep each kind of change in one place."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import project


def project_modules() -> list:
    """Every module of the package that imports without optional extras (serve, audit, sweep need none)."""
    modules = []
    for info in pkgutil.walk_packages(project.__path__, f"{project.__name__}."):
        if info.name.endswith("__main__"):
            continue
        modules.append(importlib.import_module(info.name))
    return modules


def test_every_override_of_a_lightning_hook_says_override() -> None:
    """Where we extend Lightning, each hook we override carries @override (so a renamed hook is found)."""
    missing = []
    for module in project_modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            bases = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] == "lightning"]
            for name, member in vars(cls).items():
                func = getattr(member, "__func__", member)
                if not inspect.isfunction(func) or name == "__init__":
                    continue
                if any(name in vars(base) for base in bases) and not getattr(func, "__override__", False):
                    missing.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    assert missing == []


def test_each_private_lightning_import_names_the_version_it_was_checked_against() -> None:
    """`from lightning... import _name` may break on an upgrade: the line above says what was checked."""
    unchecked = []
    for path in sorted(Path(project.__file__).parent.rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s*from lightning[\w.]* import _", line) and "checked against lightning" not in (
                lines[i - 1] if i else ""
            ):
                unchecked.append(f"{path.name}:{i + 1}")
    assert unchecked == []


def test_only_atomic_py_renames_files_into_place() -> None:
    """Every atomic write goes through project.atomic (new.py renames the whole copy it built, a folder)."""
    renaming = {
        path.relative_to(Path(project.__file__).parent).as_posix()
        for path in Path(project.__file__).parent.rglob("*.py")
        if re.search(r"\bos\.(replace|rename)\(|\.rename\(", path.read_text())
    }
    assert renaming == {"atomic.py", "new.py"}


def test_the_task_is_read_in_one_place_and_class_names_fall_back_in_one() -> None:
    """`is_multilabel`/`.multilabel` answer "which task?" and `label_names` the missing names: no copies."""
    package = Path(project.__file__).parent
    task = re.compile(r"""[=!]= *["']multi(label|class)["']|["']multi(label|class)["'] *[=!]=""")
    fallback = re.compile(r"class_names[\"']?(, None\))? or\b")
    copies = []
    for path in sorted(package.rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines()):
            if task.search(line) or fallback.search(line):
                copies.append(f"{path.relative_to(package).as_posix()}:{i + 1}")
    assert {c.split(":")[0] for c in copies} == {"deploy/sidecar.py", "model.py"}, copies


def test_label_names_fall_back_to_label_numbers() -> None:
    from project.model import ImageClassifier, label_names

    named = ImageClassifier(num_classes=3, class_names=["a", "b", "c"], backbone="resnet18")
    unnamed = ImageClassifier(num_classes=3, backbone="resnet18", task="multilabel")
    assert named.label_names == ["a", "b", "c"] and not named.multilabel
    assert unnamed.label_names == ["0", "1", "2"] and unnamed.multilabel
    assert label_names(object(), count=2) == ["0", "1"]


def test_imports_follow_the_layers() -> None:
    """Callbacks and the export step sit below the trainer and the CLI: they never import them."""
    package = Path(project.__file__).parent
    upward = [
        path.relative_to(package).as_posix()
        for path in [*package.glob("callbacks/*.py"), *package.glob("export/*.py")]
        if re.search(
            r"^from project(\.trainer|\.cli)? import (trainer|cli)\b|^from project\.(trainer|cli) import",
            path.read_text(),
            re.M,
        )
    ]
    assert upward == []


def test_conftest_holds_only_fixtures() -> None:
    """Plain helpers live in tests/helpers.py, so tests import them from there, not from conftest."""
    tests = Path(__file__).parent
    conftest = tests / "conftest.py"
    functions = re.findall(r"^(@pytest\.fixture.*\n)?def (\w+)", conftest.read_text(), re.M)
    assert [name for fixture, name in functions if not fixture] == []
    importing = [
        p.name for p in tests.glob("*.py") if re.search(r"^from tests\.conftest import", p.read_text(), re.M)
    ]
    assert importing == []


def test_every_callback_is_registered_in_the_one_table() -> None:
    """Each callback of project.callbacks is a row of cli.CALLBACKS (with flags) or cli.BUILT_IN, and no
    config lists one of them in trainer.callbacks (that list is for a run's extras only)."""
    import yaml
    from lightning.pytorch import Callback

    from project import callbacks, cli

    registered = {c for c, _ in cli.CALLBACKS.values()} | set(cli.BUILT_IN)
    # AtomicSaveConfig: LightningCLI's save_config_callback, which the CLI itself adds
    extras = {"AtomicSaveConfig"}
    ours = {
        obj
        for info in pkgutil.iter_modules(callbacks.__path__, f"{callbacks.__name__}.")
        for obj in vars(importlib.import_module(info.name)).values()
        if inspect.isclass(obj) and issubclass(obj, Callback) and obj.__module__ == info.name
    }
    assert {c.__name__ for c in ours - registered} == extras
    configs = Path(__file__).resolve().parents[1] / "configs"
    names = {c.__name__ for c in registered}
    repeated = [
        f"{path.relative_to(configs)}: {entry['class_path']}"
        for path in configs.rglob("*.yaml")
        for entry in ((yaml.safe_load(path.read_text()) or {}).get("trainer") or {}).get("callbacks") or []
        if isinstance(entry, dict) and entry.get("class_path", "").rsplit(".", 1)[-1] in names
    ]
    assert repeated == []


def test_the_deployment_side_imports_neither_torch_nor_lightning() -> None:
    """Every module under project.deploy (infer, serve, the predictions CSV, calibration) runs an export
    with onnxruntime, numpy and Pillow: importing them all loads no torch and no lightning."""
    import subprocess
    import sys

    from project import deploy

    names = [info.name for info in pkgutil.walk_packages(deploy.__path__, f"{deploy.__name__}.")]
    assert len(names) >= 10, names  # infer, prediction_csv, calibration and the serve modules
    probe = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted({'torch', 'lightning', 'torchvision'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_user_errors_end_a_command_in_one_place() -> None:
    """errors.exits_on_user_error is the one block that prints a UserError and exits: no copies, and no
    `sys.exit("error: ...")` (that exits with status 1, not 2)."""
    package = Path(project.__file__).parent
    printing = sorted(
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if re.search(r"""error: \{user_message|sys\.exit\(f?["']""", path.read_text())
    )
    assert printing == ["errors.py"]


def test_no_import_cycles_between_the_rooms_of_the_package() -> None:
    """A room is a top-level module (cli, model, trainer, ...) or a subpackage (data, deploy, callbacks,
    sweep, audit); its imports, those inside functions included, never lead back to it through other rooms."""
    package, top = Path(project.__file__).parent, project.__name__

    def room(name: str) -> str:  # <package>.data.index -> data; <package>.cli -> cli
        return name.split(".")[1] if name.count(".") else name

    graph: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        source = room(".".join((top, *path.relative_to(package).with_suffix("").parts)))
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == top:
                names = [f"{top}.{a.name}" for a in node.names]  # the modules of `from <package> import a, b`
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.startswith(f"{top}.") and room(name) != source:
                    graph.setdefault(source, set()).add(room(name))

    def cycle_from(start: str) -> list[str] | None:  # depth-first: the first path back to start
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    return [*path, start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
        return None

    cycles = [" -> ".join(cycle) for start in sorted(graph) if (cycle := cycle_from(start))]
    assert cycles == []
