"""The optional rooms (project.rooms): each can be left out whole, and nothing else depends on it.

The static tests read the template as `new --without ROOM` would copy it (each shared file less the
lines marked for ROOM) and look for any trace of the room: an import of its modules, its module or file
names, a Markdown link to its pages, its extras or commands. The clone tests make real copies.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
import tomllib

from project import new
from project.errors import UserError
from project.rooms import MARKER, ROOMS, Room, marked_rooms, rooms_of, with_dependents, without

REPO = Path(__file__).resolve().parents[1]
PACKAGE = new.PACKAGE
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # a Markdown link's target, less its anchor


@cache
def files() -> tuple[str, ...]:
    return tuple(new.template_files(REPO))


@cache
def text(rel: str) -> str | None:
    """A file's text; None for a binary file and for a link (src/<package>/template/: its target is read)."""
    if (REPO / rel).is_symlink():
        return None
    try:
        return (REPO / rel).read_text(encoding="utf-8")
    except (UnicodeDecodeError, IsADirectoryError):
        return None


def owned(name: str) -> list[str]:
    return [rel for rel in files() if name in rooms_of(rel)]


def module_names(paths: list[str]) -> set[str]:
    """The dotted names of the package's modules and packages among `paths` (`<package>.sweep.command`)."""
    return {
        ".".join(Path(rel).with_suffix("").parts[1:]).removesuffix(".__init__")
        for rel in paths
        if rel.startswith(f"src/{PACKAGE}/") and rel.endswith(".py")
    }


def modules(name: str) -> list[str]:
    """The dotted names of a room's modules and packages (`<package>.<room>`, `<package>.<room>.command`)."""
    return sorted(module_names(owned(name)))


def test_every_room_owns_files_of_its_own_and_its_extras_exist() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, room in ROOMS.items():
        assert owned(name), f"room {name}: no file matches {room.files}"
        unmatched = [p for p in room.files if not any(fnmatch.fnmatch(rel, p) for rel in files())]
        assert unmatched == [], f"room {name}: patterns that match nothing"
        assert set(room.extras) <= set(extras), name
    # a file of two rooms goes with either: only the installed template's links (`new`'s, and the room's)
    # and a benchmark of one room's code on another's (each entry's line of it marked for the other room)
    shared = [rel for rel in files() if len(rooms_of(rel)) > 1]
    assert all(rel.startswith((f"src/{PACKAGE}/template/", "bench/")) for rel in shared), shared


def test_every_room_name_can_be_written_in_a_marker() -> None:
    """A name MARKER cannot read (a capital, a dash) would leave the room's marked lines in every copy."""
    for name in ROOMS:
        for marker in (f"# {R}: {name}", f"<!-- {R}: {name} begin -->", f"# {R}: other, {name}"):
            found = MARKER.search(marker)
            assert found is not None and name in marked_rooms(found), marker


def test_every_marker_names_a_room_and_every_block_closes() -> None:
    problems = []
    for rel in files():
        content = text(rel)
        if content is None:
            continue
        open_blocks: list[str] = []
        for number, line in enumerate(content.splitlines(), 1):
            found = MARKER.search(line)
            if not found:
                continue
            names = marked_rooms(found)
            problems += [f"{rel}:{number}: room {n!r} is not in ROOMS" for n in names if n not in ROOMS]
            code = line[: found.start()]
            if rel.endswith(".py") and not found["edge"] and re.search(rf"\b{PACKAGE}\b", code):
                # `new` renames the package, and the formatter may then wrap the line, leaving the marker
                # on one piece of it
                problems.append(f"{rel}:{number}: a line naming the package is marked as a block, not a line")
            if found["edge"] and len(names) > 1:
                problems.append(f"{rel}:{number}: a block belongs to one room, not {names}")
            if found["edge"] == "begin":
                open_blocks.append(names[0])
            elif found["edge"] == "end" and (not open_blocks or open_blocks.pop() != names[0]):
                problems.append(f"{rel}:{number}: `room: {names[0]} end` closes no block of it")
        problems += [f"{rel}: `room: {name} begin` is never closed" for name in open_blocks]
    assert problems == []


def suffixes(paths: list[str]) -> set[str]:
    """The paths, and each of their ends of two parts or more (`b/c.py` of `a/b/c.py`)."""
    return {"/".join(Path(p).parts[i:]) for p in paths for i in range(len(Path(p).parts) - 1)}


def test_what_stays_without_a_room_names_none_of_it() -> None:
    """Every file another room or the core keeps, less the lines marked for the room: no import of the
    room's modules, no mention of them or of its files, no Markdown link to its pages."""
    assert [trace for name in ROOMS for trace in traces_of(name)] == []


def traces_of(name: str) -> list[str]:
    room_files = owned(name)
    dotted = modules(name)
    names = re.compile(r"\b(" + "|".join(map(re.escape, dotted)) + r")\b") if dotted else None
    # a file named by its path from the root or from a folder on the way (`b/c.py` of `a/b/c.py`),
    # unless another file's path ends the same way (deploy/src/project/ mirrors src/project/)
    dependents = with_dependents({name})  # rooms that need this one go with it
    kept = [rel for rel in files() if not rooms_of(rel) & dependents]
    paths = suffixes(room_files) - suffixes(kept) - suffixes([str(Path(rel).parent) for rel in kept])
    mentions = re.compile(r"(?<![\w/.-])(" + "|".join(map(re.escape, sorted(paths))) + r")(?![\w-])")
    # its commands run (`-m <package> NAME`), or given a row of their own (`| `NAME` |`, `"NAME": [`)
    commands = "|".join(map(re.escape, ROOMS[name].commands)) or "(?!)"
    uses = re.compile(rf"-m {PACKAGE} ({commands})\b|^\| `({commands})` \||^\s*\"({commands})\": [\[(]", re.M)
    traces = []
    for rel in kept:
        if (content := text(rel)) is None:
            continue
        kept_text = without(content, dependents)
        if rel.endswith(".py"):
            found = names.findall(kept_text) if names else []
            traces += [f"{rel}: names {n}" for n in sorted(set(found))]
        traces += [f"{rel}: names {m}" for m in sorted(set(mentions.findall(kept_text)))]
        traces += [f"{rel}: runs or lists `{m.group(0).strip()}`" for m in uses.finditer(kept_text)]
        if rel.endswith((".md", ".ipynb")):
            for target in LINK.findall(kept_text):
                resolved = os.path.normpath(Path(rel).parent / target).replace(os.sep, "/")
                if resolved in room_files:
                    traces.append(f"{rel}: links to {target}")
    return traces


def test_without_a_room_its_extras_and_commands_go() -> None:
    full = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, room in ROOMS.items():
        kept = tomllib.loads(without((REPO / "pyproject.toml").read_text(), {name}))
        extras = kept["project"]["optional-dependencies"]
        assert not set(room.extras) & set(extras), name
        leftover = [r for extra in room.extras for r in full[extra] if r in extras["dev"]]
        assert leftover == [], f"without {name}, dev still installs {leftover}"
        dispatch = ast.parse(without((REPO / "src" / PACKAGE / "__main__.py").read_text(), {name}))
        tables = {
            node.targets[0].id: {key.value for key in node.value.keys}
            for node in dispatch.body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("COMMANDS", "TRAINING")
        }
        left = tables["COMMANDS"] | tables["TRAINING"]
        assert "fit" in left and not set(room.commands) & left, (name, left)


def test_the_core_and_each_room_import_no_other_room() -> None:
    """Imports anywhere in a module (inside functions too: a left-out room's module is gone), once the
    lines marked for the imported room are left out; a room may import those it `needs`."""
    owners = {module: name for name in ROOMS for module in modules(name)}
    found = []
    for rel in files():
        if not rel.endswith(".py") or (content := text(rel)) is None:
            continue
        homes = rooms_of(rel)
        for name in ROOMS:
            if name in homes or any(name in ROOMS[home].needs for home in homes):
                continue
            for node in ast.walk(ast.parse(without(content, {name}))):
                imported = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    imported = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                found += [f"{rel} imports {m} ({name})" for m in imported if owners.get(m) == name]
    assert found == []


def test_a_room_that_needs_another_goes_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, room in ROOMS.items():
        assert set(room.needs) <= set(ROOMS) - {name}, name
    rooms = {
        "a": Room("a", ("a/*",)),
        "b": Room("b", ("b/*",), needs=("a",)),
        "c": Room("c", ("c/*",), needs=("b",)),
    }
    monkeypatch.setattr("project.rooms.ROOMS", rooms)
    assert with_dependents({"a"}) == {"a", "b", "c"} and with_dependents({"b"}) == {"b", "c"}
    assert with_dependents({"c"}) == {"c"}


def test_new_says_which_rooms_go_with_the_ones_asked_and_leaves_them_out(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leaving out a room that others need leaves them out too, and says so. In a copy where no room
    needs another, two of its rooms are made to: the rule is tested on their real files all the same."""
    asked = next((need for room in ROOMS.values() for need in room.needs), None)
    if asked is None:
        asked, second = sorted(ROOMS)[:2]
        monkeypatch.setattr("project.rooms.ROOMS", {**ROOMS, second: replace(ROOMS[second], needs=(asked,))})
    needing = with_dependents({asked}) - {asked}
    new.main([str(tmp_path / "copy"), "--name", "task", "--without", asked])
    said = capsys.readouterr().out
    assert needing and said.startswith(
        f"Leaving out {', '.join(sorted(needing))} too: they need {asked}.\n"
    ), said
    for name in needing | {asked}:
        assert not [
            rel for rel in owned(name) if (tmp_path / "copy" / rel.replace(PACKAGE, "task", 1)).exists()
        ]


def test_an_unknown_room_is_one_error_line_and_writes_nothing(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        new.main([str(tmp_path / "copy"), "--name", "task", "--without", "nope"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --without 'nope': 'nope' is not a room; ")
    assert "Fix: " in err and not (tmp_path / "copy").exists()


def test_new_help_lists_every_room() -> None:
    done = subprocess.run(
        [sys.executable, "-m", PACKAGE, "new", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0
    for name, room in ROOMS.items():
        summary = room.summary + (f" (left out with {' or '.join(room.needs)})" if room.needs else "")
        assert re.search(rf"^  {name} +{re.escape(summary)}$", done.stdout, re.M), name


# One interpreter per lane worker imports once the packages every copy's core needs (torch, Lightning,
# ONNX, pytest: 6-10 s a start on 2 cores) and forks a fresh child for each run of a copy's tests. A fork
# shares nothing one run changes with the next; a room's packages are not imported ahead, or a copy that
# imported one without its extra would pass here.
FORK_SERVER = """
import importlib, json, os, sys
import jsonargparse, lightning, numpy, onnx, onnxruntime, PIL.Image, pytest, tensorboard, torch, torchmetrics
import torchvision, yaml

for line in sys.stdin:
    dest, args, log = json.loads(line)
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(output, 1), os.dup2(output, 2)
            os.chdir(dest)  # as `PYTHONPATH=DEST/src python -m pytest ARGS` run in DEST
            os.environ["PYTHONPATH"] = os.path.join(dest, "src")
            sys.path[:1] = [dest, os.environ["PYTHONPATH"]]
            importlib.invalidate_caches()
            status = int(pytest.main(args))
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(status)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.fixture(scope="session")
def fork_server(tmp_path_factory: pytest.TempPathFactory):
    server = subprocess.Popen(
        [sys.executable, "-c", FORK_SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path_factory.mktemp("fork_server"),
    )
    yield server
    server.stdin.close()
    server.wait(timeout=60)


def run_tests(server: subprocess.Popen, dest: Path, *args: str) -> None:
    """pytest in the copy at `dest` (`PYTHONPATH=DEST/src python -m pytest ARGS`), in one process: a lane
    test holds one of the two cores."""
    log = dest.parent / f"{dest.name}-pytest.log"
    pytest_args = ["-q", "-p", "no:cacheprovider", "-n", "0", *args]
    server.stdin.write(json.dumps([str(dest), pytest_args, str(log)]) + "\n")
    server.stdin.flush()
    status = server.stdout.readline()
    output = log.read_text() if log.exists() else ""
    assert status.strip() == "0", f"exit status {status.strip() or 'none'}:\n{output[-5000:]}"


@pytest.fixture
def core_copy(tmp_path: Path) -> Path:
    """`new --without all`: the core alone, as the `core_task` package."""
    dest = tmp_path / "core"
    new.main([str(dest), "--name", "core_task", "--without", "all"])
    return dest


@pytest.mark.slow
@pytest.mark.rooms
def test_the_core_alone_passes_its_slow_tests(core_copy: Path, fork_server: subprocess.Popen) -> None:
    """The core copy's own slow tests (training, DDP, interruptions, the installed package). First in the
    file, so that the lane starts its longest item first; the next test runs the rest of the copy's suite,
    on the other worker."""
    run_tests(fork_server, core_copy, "-m", "slow")


@pytest.mark.slow
@pytest.mark.rooms
def test_the_core_alone_has_no_room_and_passes_its_tests(
    core_copy: Path, fork_server: subprocess.Popen, shapes_root: Path
) -> None:
    """`new --without all`: none of any room's files, extras or commands; its code passes the linter (no
    import left unused by a removed line), its own fast lane passes, its help lists no room's command,
    and it trains. Its slow tests are the test above's: the two workers share the copy's suite."""
    dest = core_copy
    for name in ROOMS:
        for rel in owned(name):
            assert not (dest / re.sub(rf"^src/{PACKAGE}/", "src/core_task/", rel)).exists(), rel
    pyproject = tomllib.loads((dest / "pyproject.toml").read_text())
    dependencies = pyproject["project"]["dependencies"]
    required = " ".join(dependencies + pyproject["project"]["optional-dependencies"]["dev"])
    for package in ("fastapi", "uvicorn", "optuna", "cleanlab", "timm", "mlflow", "wandb"):
        assert package not in required, package
    assert "room:" not in (dest / "README.md").read_text()
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "F", "."],
        cwd=dest,
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout[-3000:]
    run_tests(fork_server, dest, "-m", "not slow")
    env = {**os.environ, "PYTHONPATH": str(dest / "src")}
    command = [sys.executable, "-m", "core_task"]
    done = subprocess.run([*command, "--help"], cwd=dest, env=env, capture_output=True, text=True)
    listed = " ".join(done.stdout.split())  # the command list, as argparse wraps it
    assert "infer (torch-free" in listed and not re.search(r"\b(serve|sweep|audit) \(", listed), listed
    flags = ["--trainer.fast_dev_run=true", "--data.image_size=32", "--data.batch_size=8"]
    fit = subprocess.run(
        [*command, "fit", f"--data.root={shapes_root}", *flags, "--data.num_workers=0"],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]


# the test library: the plain modules beside the test files (tests/helpers.py, exports.py, ...)
SHARED_TESTS = tuple(
    sorted(
        path.stem
        for path in (REPO / "tests").glob("*.py")
        if not path.name.startswith("test_") and path.stem not in ("__init__", "conftest")
    )
)


def imports_shared(rel: str, names: set[str]) -> bool:
    """Whether the test file `rel` imports one of the shared test modules `names` (anywhere in it)."""
    return any(re.search(rf"^\s*from tests(\.| import ){name}\b", text(rel) or "", re.M) for name in names)


def changed_tests(left_out: set[str]) -> list[str]:
    """The test files a copy without the rooms `left_out` keeps with lines removed (marked for one of
    them), and those that import a shared test module it changes, or one importing such a module: the
    tests the removal can break."""
    kept = [rel for rel in files() if rel.startswith("tests/") and rel.endswith(".py")]
    kept = [rel for rel in kept if not rooms_of(rel) & left_out]
    changed = {rel for rel in kept if without(text(rel) or "", left_out) != text(rel)}
    shared = {Path(rel).stem for rel in changed if Path(rel).stem in SHARED_TESTS}
    while more := {n for n in SHARED_TESTS if n not in shared and imports_shared(f"tests/{n}.py", shared)}:
        shared |= more
    changed |= {rel for rel in kept if imports_shared(rel, shared)}
    return sorted(rel for rel in changed if Path(rel).name.startswith("test_"))


@pytest.mark.slow
@pytest.mark.rooms
@pytest.mark.parametrize("room", list(ROOMS))
def test_a_copy_without_each_room_passes_its_conventions_and_the_tests_it_changes(
    room: str, tmp_path: Path, fork_server: subprocess.Popen
) -> None:
    """`new --without ROOM` for each room: pyflakes (ruff's F rules) finds no name the removed lines left
    undefined and no import they left unused, in the copy's source, tests and benchmarks; and in the copy,
    its convention tests and the fast lane of every test file the removal changed pass."""
    dest = tmp_path / "copy"
    new.main([str(dest), "--name", "leafnet", "--without", room])
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "F", "--output-format", "concise", "."],
        cwd=dest,
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout[-3000:]
    # this file's own rules already read every copy without a room: it is not run again in each
    chosen = {"tests/test_conventions.py", *changed_tests(with_dependents({room}))} - {"tests/test_rooms.py"}
    run_tests(fork_server, dest, "-m", "not slow", *sorted(chosen))


def test_the_tests_a_removal_changes_are_found() -> None:
    """A kept test file with a marker of a left-out room is in the lane, a left-out room's own file is not,
    and a changed shared test module brings in every test file that imports it."""
    for name in ROOMS:
        left_out = with_dependents({name})
        found = set(changed_tests(left_out))
        assert not [rel for rel in found if rooms_of(rel) & left_out], name
        kept = [
            rel for rel in files() if re.fullmatch(r"tests/\w+\.py", rel) and not rooms_of(rel) & left_out
        ]
        for rel in kept:
            marked = {n for m in MARKER.finditer(text(rel) or "") for n in marked_rooms(m)} & left_out
            if marked and Path(rel).name.startswith("test_"):
                assert rel in found, (name, rel)
            if marked and Path(rel).stem in SHARED_TESTS:
                users = {
                    u
                    for u in kept
                    if Path(u).name.startswith("test_") and imports_shared(u, {Path(rel).stem})
                }
                assert users <= found, (name, rel, users - found)
    # test_int8.py imports tests/exports.py, which has lines of the unknown room  # room: int8, unknown
    assert "tests/test_int8.py" in changed_tests({"unknown"})  # room: int8, unknown


@pytest.mark.slow
def test_a_copy_under_a_long_name_keeps_its_markers_whole(tmp_path: Path) -> None:
    """The formatter re-wraps lines that a long package name makes too long: a copy's own markers must
    still pair up and leave out what they mark (its static rooms tests pass)."""
    dest = tmp_path / "long"
    name = "a_package_name_long_enough_to_wrap_the_lines_that_name_it"
    new.main([str(dest), "--name", name, "--without", "serve"])
    env = {**os.environ, "PYTHONPATH": str(dest / "src")}
    # its markers pair up and leave out what they mark: what stays parses, imports and names no room left out
    chosen = ["-k", "every_marker or what_stays", "tests/test_rooms.py"]
    pytest_args = ["-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow", *chosen]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


R = "room"  # the markers below are spelt through it, so that this file holds none itself


@pytest.mark.parametrize(
    "text",
    [
        f"a\n# {R}: serve begin\nb\n",  # never closed: the rest of the file would go
        f"a\n# {R}: serve end\n",
        f"# {R}: serve begin\nb\n# {R}: sweep end\n",
    ],
)
def test_markers_that_do_not_pair_up_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="room: s"):
        without(text, set())


def test_a_line_marked_for_two_rooms_goes_with_either() -> None:
    block = f"<!-- {R}: audit begin -->\nc\n<!-- {R}: audit end -->\n"
    text = f"a\nb  # {R}: serve, sweep\n{block}d\n"
    assert without(text, {"sweep"}) == f"a\n{block}d\n"
    assert without(text, {"audit"}) == f"a\nb  # {R}: serve, sweep\nd\n"
    assert without(text, set()) == text


@pytest.mark.parametrize("left_out", [*([name] for name in ROOMS), list(ROOMS)], ids=[*ROOMS, "all"])
def test_what_stays_parses_and_imports_only_what_stays(left_out: list[str]) -> None:
    """Each file a `--without` copy keeps, less its marked lines: Python, TOML and YAML still parse, and
    every module of the package it imports (inside functions too) is one the copy has."""
    import yaml

    gone = with_dependents(set(left_out))
    kept = [rel for rel in files() if not rooms_of(rel) & gone]
    present, every = module_names(kept), module_names(list(files()))
    problems = []
    for rel in kept:
        if (content := text(rel)) is None:
            continue
        stripped = without(content, gone)
        try:
            if rel.endswith(".py"):
                tree = ast.parse(stripped)
            elif rel.endswith(".toml"):
                tomllib.loads(stripped)
            elif rel.endswith((".yaml", ".yml")):
                yaml.safe_load(stripped)
        except (SyntaxError, tomllib.TOMLDecodeError, yaml.YAMLError) as e:
            problems.append(f"{rel}: {type(e).__name__}: {e}")
            continue
        if not rel.endswith(".py"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from package.x import name`: package.x must be there (name may be a function);
                # `from package import x`: x, where it is a module of the template
                names = [f"{node.module}.{a.name}" for a in node.names]
                imported = names if node.module == PACKAGE else [node.module]
                problems += [
                    f"{rel}: imports {m}, which the copy has not" for m in imported if m in every - present
                ]
            elif isinstance(node, ast.Import):
                problems += [
                    f"{rel}: imports {a.name}, which the copy has not"
                    for a in node.names
                    if a.name.startswith(f"{PACKAGE}.") and a.name not in present
                ]
    assert problems == []


def test_new_refuses_markers_that_do_not_pair_up_in_one_line_naming_the_file() -> None:
    with pytest.raises(UserError) as refused:
        new.marked_out(f"a\n# {R}: serve begin\nb\n", frozenset({"serve"}), "src/x.py")
    message = str(refused.value)
    assert message.startswith("'src/x.py' has room markers that do not pair up (`room: serve begin`")
    assert "nothing was written. Fix: close each `room: NAME begin` with `room: NAME end`" in message
