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
    expected = {"atomic.py"}
    expected.add("new.py")  # room: new
    assert renaming == expected


def test_the_task_is_read_in_one_place_and_class_names_fall_back_in_one() -> None:
    """`label_names` gives the missing names: no copies.
    # room: multilabel begin
    And `is_multilabel`/`.multilabel` answer "which task?".
    # room: multilabel end
    """
    package = Path(project.__file__).parent
    compared = re.compile(r"""[=!]= *["']multi(label|class)["']|["']multi(label|class)["'] *[=!]=""")
    fallback = re.compile(r"class_names[\"']?(, None\))? or\b")
    copies = []
    for path in sorted(package.rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines()):
            if compared.search(line) or fallback.search(line):
                copies.append(f"{path.relative_to(package).as_posix()}:{i + 1}")
    expected: set[str] = set()
    expected |= {"deploy/sidecar.py", "model.py"}  # room: multilabel
    assert {c.split(":")[0] for c in copies} == expected, copies


def test_label_names_fall_back_to_label_numbers() -> None:
    from project.model import ImageClassifier, label_names

    named = ImageClassifier(num_classes=3, class_names=["a", "b", "c"], backbone="resnet18")
    unnamed = ImageClassifier(num_classes=3, backbone="resnet18")
    assert named.label_names == ["a", "b", "c"]
    assert unnamed.label_names == ["0", "1", "2"]
    # room: multilabel begin
    multilabel = ImageClassifier(num_classes=3, backbone="resnet18", task="multilabel")
    assert multilabel.label_names == ["0", "1", "2"] and multilabel.multilabel and not named.multilabel
    # room: multilabel end
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
    """Each callback of project.callbacks is a row of cli.CALLBACKS (with flags), cli.BUILT_IN or
    cli.CONSOLE, and no config lists one of them in trainer.callbacks (that list is for a run's extras
    only)."""
    import yaml
    from lightning.pytorch import Callback

    from project import callbacks, cli

    registered = {c for c, _ in cli.CALLBACKS.values()} | set(cli.BUILT_IN)
    registered |= set(cli.CONSOLE)  # room: console
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
    """Every module under project.deploy (infer, serve, the predictions CSV, the probabilities) runs an export
    with onnxruntime, numpy and Pillow: importing them all loads no torch and no lightning."""
    import subprocess
    import sys

    from project import deploy

    names = [info.name for info in pkgutil.walk_packages(deploy.__path__, f"{deploy.__name__}.")]
    # every module file under deploy/ is walked (its own __init__.py is the package imported above)
    assert len(names) == len(list(Path(deploy.__file__).parent.rglob("*.py"))) - 1, names
    assert {"infer", "classifier", "outputs", "prediction_csv"} <= {n.rpartition(".")[2] for n in names}
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


# ---- the fast lane: `pytest -m "not slow"` ------------------------------------------------------------
# A static reading of the tests (their AST), so that the check itself costs nothing: a test is expensive
# when its body, a fixture it requests or a function it calls (transitively, across tests/*.py) trains
# (Trainer.fit, or the fit / sweep / lr_find / batch_size_find / audit command, in process or as a
# subprocess) or starts a server (a process given a --port). A command expected to be refused
# (`run_cli("fit", bad) == 2`) and `--print_config` train nothing.

TRAINING_COMMANDS = {"fit", "sweep", "lr_find", "batch_size_find"}
TRAINING_ENTRIES = {
    # room: audit begin
    "project.audit.command": "main",  # audit trains a model per fold
    # room: audit end
}


def _words(node: ast.AST) -> list[str]:
    """The string constants among a call's arguments or a list's items (and lists starred into them)."""
    words = []
    for item in [*getattr(node, "args", []), *getattr(node, "elts", [])]:
        item = item.value if isinstance(item, ast.Starred) else item
        if isinstance(item, (ast.List, ast.Tuple)):
            words += _words(item)
        elif isinstance(item, ast.Constant) and isinstance(item.value, str):
            words.append(item.value)
    return words


def _root(node: ast.AST) -> str:
    """The name an expression starts from: `done` of `done.returncode`, `exited` of `exited.value.code`."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _runs(definition: ast.FunctionDef | ast.ClassDef) -> list[ast.AST]:
    """The nodes of a body (not its decorators, whose parametrize lists name commands), less the calls
    expected to be refused: `run_cli("fit", bad) == 2`, `done = run(...)` then `done.returncode == 2`,
    and whatever runs inside `with pytest.raises(SystemExit)`."""
    nodes = [node for statement in definition.body for node in ast.walk(statement)]
    failing = [  # `X == 2`: a nonzero exit status
        node.left
        for node in nodes
        if isinstance(node, ast.Compare)
        and any(isinstance(c, ast.Constant) and type(c.value) is int and c.value for c in node.comparators)
    ]
    names = {_root(left) for left in failing} - {""}
    failing += [
        node.value
        for node in nodes
        if isinstance(node, ast.Assign) and any(_root(target) in names for target in node.targets)
    ]
    failing += [  # `with pytest.raises(SystemExit)`: a command that stops on its options (a training
        statement  # stopped by an error, NonFiniteError say, has trained until then)
        for node in nodes
        if isinstance(node, ast.With)
        and any(ast.unparse(item.context_expr).startswith("pytest.raises(SystemExit") for item in node.items)
        for statement in node.body
    ]
    refused = {id(inner) for node in failing for inner in ast.walk(node)}
    return [node for node in nodes if id(node) not in refused]


def _expensive_itself(definition: ast.FunctionDef | ast.ClassDef) -> str | None:
    """Why this body trains or starts a server by itself; None when it does neither."""
    nodes = _runs(definition)
    if any(
        isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "setattr" and "fit" in _words(n)
        for n in nodes
    ):
        return None  # Trainer.fit replaced: the command is parsed, not run
    for node in nodes:
        if not isinstance(node, (ast.Call, ast.List, ast.Tuple)):
            continue
        method = getattr(node.func, "attr", "") if isinstance(node, ast.Call) else ""
        if method == "fit":
            return "calls Trainer.fit"
        words = _words(node)
        if method == "setup" or "--print_config" in words:  # DataModule.setup("fit"), a printed config
            continue
        if command := sorted(TRAINING_COMMANDS & set(words)):
            return f"runs `{command[0]}`"
        if any(word.startswith("--port") for word in words):
            return "starts a server"
    return None


class _TestModule:
    """The top-level definitions of one file of tests/, the fixtures among them and what it imports."""

    def __init__(self, source: str) -> None:
        self.defs: dict[str, ast.FunctionDef | ast.ClassDef] = {}
        self.fixtures: set[str] = set()
        self.imported: dict[str, tuple[str, str]] = {}  # local name: (tests module, its name there)
        self.trainers: set[str] = set()  # local names of TRAINING_ENTRIES
        self.slow = False  # pytestmark = pytest.mark.slow
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
                if any("fixture" in ast.unparse(d) for d in node.decorator_list):
                    self.fixtures.add(node.name)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (node.module.split(".")[1], alias.name)
            elif isinstance(node, ast.ImportFrom) and node.module in TRAINING_ENTRIES:
                entry = TRAINING_ENTRIES[node.module]
                self.trainers |= {a.asname or a.name for a in node.names if a.name == entry}
            elif isinstance(node, ast.Assign) and "pytestmark" in ast.unparse(node.targets[0]):
                self.slow = "mark.slow" in ast.unparse(node.value)


def unmarked_expensive_tests(sources: dict[str, str]) -> dict[str, str]:
    """{"test_x.py::test_y": why} for each test that trains or starts a server without the slow mark.

    Args:
        sources: the text of each module of tests/ by name ("conftest", "helpers", "test_x", ...).
    """
    modules = {name: _TestModule(source) for name, source in sources.items()}
    known: dict[tuple[str, str], str | None] = {}

    def resolve(module: str, name: str, fixture: bool) -> tuple[str, str] | None:
        if fixture and name not in modules[module].fixtures:
            module = "conftest"
        if name in modules[module].defs:
            return module, name
        other, real = modules[module].imported.get(name, ("", ""))
        return (other, real) if real in getattr(modules.get(other), "defs", {}) else None

    def why(module: str, name: str) -> str | None:
        if (module, name) not in known:
            known[module, name] = None  # a cycle adds nothing
            definition = modules[module].defs[name]
            nodes = _runs(definition)
            local = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            used = [(n.id, False) for n in nodes if isinstance(n, ast.Name) and n.id not in local]
            used += [  # request.getfixturevalue("name")
                (n.args[0].value, True)
                for n in nodes
                if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "getfixturevalue"
                if n.args and isinstance(n.args[0], ast.Constant)
            ]
            used += (
                [(a.arg, True) for a in getattr(definition.args, "args", [])]
                if hasattr(definition, "args")
                else []
            )
            found = _expensive_itself(definition)
            for used_name, fixture in used:
                if found:
                    break
                if not fixture and used_name in modules[module].trainers:
                    found = f"runs {used_name} of {', '.join(TRAINING_ENTRIES)}"
                elif (target := resolve(module, used_name, fixture)) and target != (module, name):
                    found = (inner := why(*target)) and f"{used_name} -> {inner}"
            known[module, name] = found
        return known[module, name]

    return {
        f"{module}.py::{name}": reason
        for module, parsed in modules.items()
        if module.startswith("test_") and not parsed.slow
        for name, definition in parsed.defs.items()
        if name.startswith("test_")
        and not any("mark.slow" in ast.unparse(d) for d in definition.decorator_list)
        if (reason := why(module, name))
    }


def test_every_test_that_trains_or_starts_a_server_is_marked_slow() -> None:
    """`pytest -m "not slow"` is the fast lane a contributor runs while working: nothing in it trains."""
    tests = Path(__file__).parent
    # this file is left out: its strings name the commands that it looks for, and it runs none of them
    sources = {path.stem: path.read_text() for path in sorted(tests.glob("*.py")) if path != Path(__file__)}
    assert unmarked_expensive_tests(sources) == {}, "mark these @pytest.mark.slow"


def test_the_slow_mark_check_follows_fixtures_helpers_and_subprocesses() -> None:
    conftest = """
from tests.helpers import train
@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    return train(tmp_path_factory.mktemp("run"))
"""
    helpers = """
def train(root):
    assert run_cli("fit", f"--data.root={root}") == 0
def serve(model):
    return subprocess.Popen([sys.executable, "-m", "project", "serve", str(model), "--port", "0"])
"""
    tests = """
from tests.helpers import serve
# room: audit begin
from project.audit.command import main as audit
# room: audit end
pytestmark = pytest.mark.gpu

def test_uses_the_trained_run(trained): ...
def test_fixture_by_name(request):
    request.getfixturevalue("trained")
def test_serves(trained):
    serve(trained)
def test_trainer_fit():
    tiny_trainer().fit(model, data)
def test_in_a_subprocess():
    subprocess.run([sys.executable, "-m", "project", "sweep", "--config=s.yaml"])
def test_audit():  # room: audit
    exit_status(audit, "--data.root=x")  # room: audit
@pytest.mark.slow
def test_marked(trained): ...
@pytest.mark.parametrize("command", ["fit", "validate"])
def test_refused(command):
    assert run_cli(command, "--trainer.max_epochs=0") == 2
    assert run_cli("fit", "--print_config") == 0
    data.setup("fit")
def test_parsed_only(monkeypatch):
    monkeypatch.setattr(Trainer, "fit", lambda *a, **k: None)
    run_cli("fit")
def test_refused_in_a_subprocess():
    done = subprocess.run([sys.executable, "-m", "project", "fit"], capture_output=True)
    assert done.returncode == 2
def test_refused_in_raises():
    with pytest.raises(SystemExit) as exited:
        serve_main(["--model", "m.onnx", "--port", "0"])
    assert exited.value.code == 2
def test_a_local_name_like_a_helper():
    serve = {"port": 1}
    assert serve
"""
    found = unmarked_expensive_tests({"conftest": conftest, "helpers": helpers, "test_x": tests})
    assert found == {
        "test_x.py::test_uses_the_trained_run": "trained -> train -> runs `fit`",
        "test_x.py::test_fixture_by_name": "trained -> train -> runs `fit`",
        "test_x.py::test_serves": "serve -> starts a server",
        "test_x.py::test_trainer_fit": "calls Trainer.fit",
        "test_x.py::test_in_a_subprocess": "runs `sweep`",
        # room: audit begin
        "test_x.py::test_audit": "runs audit of project.audit.command",
        # room: audit end
    }
    marked = tests.replace("pytestmark = pytest.mark.gpu", "pytestmark = [pytest.mark.gpu, pytest.mark.slow]")
    assert unmarked_expensive_tests({"conftest": conftest, "helpers": helpers, "test_x": marked}) == {}


def test_every_command_parser_ends_a_refused_command_line_in_one_error_line() -> None:
    """argparse's own parser prints its usage and a bare `error:`; errors.CommandParser raises a UserError."""
    package = Path(project.__file__).parent
    plain = sorted(
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if re.search(r"argparse\.ArgumentParser\(", path.read_text())
    )
    assert plain == []


def test_the_presets_and_sweeps_name_the_monitored_metric_as_the_code_does() -> None:
    """metrics.MONITOR is the one name of the monitored metric; a preset or sweep (which any run may add)
    that monitors a metric or makes it an objective names that one: a renamed metric would leave early
    stopping watching nothing. An experiment may pick its own
    (configs/experiments/multilabel.yaml: val/f1_macro).  # room: multilabel
    """
    import yaml

    from project.metrics import MONITOR

    def named(node: object) -> list[str]:
        if isinstance(node, dict):
            found = [v for k, v in node.items() if k in ("monitor", "metric") and isinstance(v, str)]
            return found + [n for v in node.values() for n in named(v)]
        return [n for v in node for n in named(v)] if isinstance(node, list) else []

    configs = Path(__file__).resolve().parents[1] / "configs"
    names = [
        (path.relative_to(configs).as_posix(), name)
        for folder in ("presets", "sweeps")
        for path in sorted((configs / folder).rglob("*.yaml"))
        for name in named(yaml.safe_load(path.read_text()))
    ]
    assert names and {name for _, name in names} == {MONITOR}, names


def test_the_python_defaults_are_default_yaml_s() -> None:
    """ImageClassifier and ImageDataModule built in Python (the API, a notebook, a test) take the values
    every command gets from configs/default.yaml: one default per option, not two that drift apart. The
    optimizer and schedule are class_path entries, set by the YAML alone."""
    import yaml

    from project.data.datamodule import ImageDataModule
    from project.model import ImageClassifier

    default = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "default.yaml").read_text())
    differ = {}
    for section, cls in (("model", ImageClassifier), ("data", ImageDataModule)):
        parameters = inspect.signature(cls.__init__).parameters
        for key, value in default[section].items():
            if isinstance(value, dict):
                continue
            own = parameters[key].default
            if (list(own) if isinstance(own, tuple) else own) != value:
                differ[f"{section}.{key}"] = (own, value)
    assert differ == {}


def test_no_test_module_imports_another() -> None:
    """What tests share lives in plain modules (tests/helpers.py, exports.py, servers.py, shard_files.py,
    bad_files.py), never in a test module: a clone that leaves a room out deletes that room's tests, and
    another room's tests must not go with them."""
    found = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            found += [f"{path.name}: {name}" for name in names if name.startswith("tests.test_")]
    assert found == []


def test_the_where_does_it_go_table_names_files_and_names_that_exist() -> None:
    """docs/new-task.md's first table: every path it names exists, every `X` it places `in FILE` is
    defined there, and every other name it gives is defined somewhere in the package."""
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "new-task.md").read_text()
    table = [line for line in page.split("\n\n| to add |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]]
    assert len(table) >= 7, table
    sources = {path: path.read_text() for path in Path(project.__file__).parent.rglob("*.py")}

    def defines(name: str, text: str) -> bool:
        last = re.escape(name.rpartition(".")[2])
        return bool(re.search(rf"^\s*(def|class) {last}\b|^\s*{last}\b[^=\n]*=", text, re.M))

    missing = []
    for row in table:
        quoted = re.findall(r"`([^`]+)`", row)
        for path in (q for q in quoted if "/" in q):
            if not (root / path).exists():
                missing.append(f"{path}: no such file or folder")
        for name, path in re.findall(r"`([\w.]+)` in `([^`]+\.py)`", row):
            if not defines(name, (root / path).read_text()):
                missing.append(f"{name}: not defined in {path}")
        for name in (q for q in quoted if re.fullmatch(r"[A-Za-z_][\w.]*(\(\))?", q)):
            if not any(defines(name.removesuffix("()"), text) for text in sources.values()):
                missing.append(f"{name}: defined nowhere in the package")
    assert missing == []


def test_the_export_targets_do_not_import_their_table() -> None:
    """targets.py imports each target's module for its row; a target's module takes its types from
    export/target.py, so the table and its rows never import each other (not even for type hints)."""
    from project.export.targets import TARGETS

    modules = {inspect.getmodule(target.load) for target in TARGETS.values()}
    assert len(modules) == len(TARGETS)
    back = [
        m.__name__
        for m in modules
        if re.search(r"export\.targets\b|export import targets\b", inspect.getsource(m))
    ]
    assert back == []


def test_ci_runs_exactly_the_readme_s_test_commands() -> None:
    """`.ci/run` ends with the Quickstart's second step, line for line: CI runs what a user is told to."""
    root = Path(__file__).resolve().parents[1]
    step = (root / "README.md").read_text().split("\n# 2. set up and run the test suite", 1)[1]
    commands = [line for line in step.split("```", 1)[0].splitlines()[1:] if line.strip()]
    assert commands and commands[0].startswith("python3 -m venv .venv && "), commands
    assert (root / ".ci" / "run").read_text().splitlines()[-len(commands) :] == commands
