"""Start a new task from this template: copy it, rename the package, and commit the copy.

    python -m project new DEST --name NAME [--without ROOM[,ROOM...] | --without all]

Copies code, configs, tests, docs, bench, README, pyproject and the CI script (no run outputs,
data, exports, environments, caches or git history); renames the package `src/<old>` to
`src/NAME` and every code reference to it; creates a git repository with one commit. Imports
neither torch nor lightning.

In a git checkout, the files git tracks are copied, as they are in the working tree (uncommitted
edits included; files git does not track, such as logs or notes lying in the clone, are not: `git
add` a new file to take it along). Outside git (a downloaded archive), every file is copied except
the EXCLUDED_NAMES patterns below. From an installed package (`pip install .`), the package itself,
its configs/ and template/ (which ships the README, pyproject, tests, docs, bench and CI script through
the links in src/<package>/template) are put back in a checkout's layout first.

--without leaves optional rooms out (project.rooms): their files, and the lines marked as theirs in the
files they share with the rest (README rows, dispatch rows, extras, test rows).
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import keyword
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from pathlib import Path

from project.errors import CommandParser, UserError, exits_on_user_error
from project.rooms import ROOMS, Room, rooms_of, with_dependents, without
from project.terminal import printable

# The package being copied: the old name in the copy, whatever this package is called today.
PACKAGE = __name__.partition(".")[0]
PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATE_ROOT = PACKAGE_DIR.parents[1]
# The package's folders that link to the top of a checkout, and the top-level name of each link in
# template/ whose name differs there (a .gitignore in the package would be read by git as its own).
LINKED = ("configs", "template")
RENAMED = {"gitignore": ".gitignore"}

# Never copied: git history, environments, caches, builds, data and exports (anywhere in the tree) ...
EXCLUDED_NAMES = (
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".mypy_cache",
    "*.egg-info",
    "build",
    "dist",
    "lightning_logs",
    "*.pyc",
    "*.onnx",
    "*.pt2",
    "*.ckpt",
    "*.partial",
    "predictions*.csv",
    "*.log",
)
# ... and at the top level: run outputs (their folders are kept through .gitkeep) and data.
EXCLUDED_TOP = ("data",)
KEEP_ONLY_GITKEEP = ("logs", "checkpoints")

# Where the copy may still say the old name: prose ("this project"), pyproject's [project] tables (also
# read as a dict, ["project"]["dependencies"] and ["project"]["optional-dependencies"]),
# a test helper function called project(...), and the docs' example of `new` (`--name my_task`, its
# commit `Start my_task`): a copy of a copy named like the example keeps that example as it was.
INTENTIONAL = (
    r"this project\b",
    r"the project\b",
    r"new project\b",
    r"\[project\b",
    r'\["project"\]\["(optional-)?dependencies"\]',
    r"\bproject\(",
    r"\.project\b",  # an attribute of another library's object (a W&B run's): never the package
    r"--name \w+",
    r"`Start \w+`",
)

# PEP 508's rule for a distribution name: ASCII letters and digits, with . _ - only inside.
PEP508_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)

GIT_IDENTITY = ("-c", "user.name=New Task", "-c", "user.email=new-task@localhost")
# A package name is a folder's name (src/NAME) and part of others (NAME.egg-info, NAME-0.1.dist-info):
# a file system holds 255 bytes in a name; this leaves room, and is far beyond a name anyone types.
MAX_NAME_LENGTH = 100


def renamer(old: str, new: str) -> list[tuple[re.Pattern[str], str]]:
    """Substitutions that rename code references to package `old`, not the word in prose."""
    o = re.escape(old)
    return [
        (re.compile(rf"\b(from|import)(\s+){o}\b"), rf"\1\2{new}"),  # import statements
        (re.compile(rf"(?<![\w\[.\-/]){o}(?=\.[A-Za-z_])"), new),  # dotted paths, not [project.x] tables
        (re.compile(rf"(-m\s+){o}\b"), rf"\1{new}"),  # python -m project
        (re.compile(rf"(?<![\w-])src/{o}\b"), f"src/{new}"),  # the package folder
        # "project": module and distribution names; not pyproject's [project] table read as a dict
        (re.compile(rf"(?P<q>[\"']){o}(?P=q)(?!\]\[(?P=q)(optional-)?dependencies)"), rf"\g<q>{new}\g<q>"),
        (re.compile(rf"^{o}( = )", re.MULTILINE), rf"{new}\1"),  # pyproject [project.scripts] entry
        (re.compile(rf"^# {o}:", re.MULTILINE), f"# {new}:"),  # README title
        (re.compile(rf"`{o}(?=[`\s])"), f"`{new}"),  # the console script in prose: `project`, `project fit`
        (re.compile(rf"(?<![\w./-]){o}(?=-deploy\b)"), new),  # the serving install's distribution name
    ]


def rename_text(text: str, rules: list[tuple[re.Pattern[str], str]]) -> str:
    for pattern, replacement in rules:
        text = pattern.sub(replacement, text)
    return text


def leftovers(root: Path, old: str = PACKAGE) -> list[str]:
    """`file:line: text` for each line under `root` that names `old` outside the INTENTIONAL places."""
    word = re.compile(rf"\b{re.escape(old)}\b")
    allowed = [re.compile(p) for p in INTENTIONAL]
    found = []
    for rel in sorted(_walk(root)):  # _walk skips .git
        if word.search(rel):
            found.append(f"{rel}: (its path)")
        try:
            lines = (root / rel).read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(lines, 1):
            rest = line
            for pattern in allowed:
                rest = pattern.sub("", rest)
            if word.search(rest):
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def excluded(rel: str) -> bool:
    """True for a path (relative, with /) that a new task must not inherit."""
    parts = rel.split("/")
    if any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in EXCLUDED_NAMES):
        return True
    if parts[0] in EXCLUDED_TOP:
        return True
    return parts[0] in KEEP_ONLY_GITKEEP and len(parts) > 1 and parts[1:] != [".gitkeep"]


def template_files(root: Path) -> list[str]:
    """The files to copy: those git tracks (outside git: a walk), minus exclusions."""
    git = shutil.which("git")
    listed = None
    if git and (root / ".git").exists():
        # tracked only: whatever else lies in a working tree (logs, notes, outputs) is not the template
        listed = subprocess.run([git, "-C", str(root), "ls-files", "-z", "--cached"], capture_output=True)
    if listed is not None and listed.returncode == 0:
        candidates = {os.fsdecode(p) for p in listed.stdout.split(b"\0") if p}
    else:  # not a git checkout (or a broken one): walk the tree
        candidates = set(_walk(root))
    # a tracked file deleted in the working tree is not copied; a link into the template stays a link
    # (src/<package>/configs -> ../../configs), others are copied as what they point to
    return sorted(
        rel
        for rel in candidates
        if not excluded(rel) and (internal_link(root / rel, root) or (root / rel).is_file())
    )


def internal_link(path: Path, root: Path) -> bool:
    """`path` is a symbolic link to something inside `root`."""
    return path.is_symlink() and path.resolve().is_relative_to(root.resolve())


def _walk(root: Path) -> list[str]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if not excluded(os.path.normpath(os.path.join(rel_dir, d)))]
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]  # not walked into
        files += [os.path.normpath(os.path.join(rel_dir, f)).replace(os.sep, "/") for f in filenames + links]
    return files


def check_name(name: str, old: str = PACKAGE) -> None:
    """NAME must work as `import NAME` and as a pip-installable distribution name, and must not hide
    a module Python already finds."""
    if len(name) > MAX_NAME_LENGTH:
        raise UserError(
            f"--name '{name[:40]}...' is {len(name):,} characters long; a package name may have at most "
            f"{MAX_NAME_LENGTH} (it names folders and files, and every import).",
            "pick a shorter name (e.g. --name leaf_disease).",
        )
    if not (name.isascii() and name.isidentifier() and PEP508_NAME.match(name)) or keyword.iskeyword(name):
        raise UserError(
            f"--name '{name}' is not a valid Python package name.",
            "use ASCII letters, digits and underscores, starting with a letter and not ending with an "
            "underscore, and not a keyword (e.g. --name leaf_disease).",
        )
    if name == old:
        return
    if name in ("tests", "bench", "configs", "docs"):
        raise UserError(f"--name '{name}' is a folder of the template.", "pick another name.")
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        raise UserError(
            f"--name '{name}' is a module of Python's standard library; `import {name}` would get that one.",
            "pick another name (e.g. with a prefix: --name my_" + name + ").",
        )
    if importlib.util.find_spec(name) is not None:
        raise UserError(
            f"--name '{name}' is already importable here (an installed package), so it would be shadowed.",
            f"pick another name (e.g. --name {name}_task).",
        )


def check_dest(dest: Path, root: Path = TEMPLATE_ROOT) -> None:
    """DEST must be new or empty, a folder and not a link to one, and outside the template (a copy
    inside it would be copied again)."""
    check_name_lengths(dest)
    if dest.is_symlink():  # the finished copy is renamed onto DEST: a link would be replaced, not filled
        raise UserError(
            f"Destination '{dest}' is a link (to '{os.readlink(dest)}'); nothing was written.",
            f"pass the folder it points to, {dest.resolve()}, or a new path.",
        )
    if dest.resolve().is_relative_to(root.resolve()):
        raise UserError(
            f"Destination '{dest}' is inside the template '{root}'; nothing was written.",
            f"pass a path outside it, e.g. {root.parent / 'my-task'}.",
        )
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserError(
            f"Destination '{dest}' already exists and is not an empty folder; nothing was written.",
            "pass a new path (it is created) or an empty folder.",
        )


def check_name_lengths(dest: Path) -> None:
    """Each part of DEST must fit the file system's limit on a name (255 bytes on most)."""
    parent = next(p for p in dest.parents if os.path.isdir(p))
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in dest.parts:
        if len(os.fsencode(part)) > limit:
            raise UserError(
                f"Destination '{dest}' has a part of {len(os.fsencode(part))} bytes ('{part[:40]}...'), "
                f"more than the {limit} bytes the file system allows in a name; nothing was written.",
                "pass a path whose folder names are shorter (e.g. ~/my-task).",
            )


def cannot_write(dest: Path, error: OSError) -> UserError:
    """The one line for a destination the system refuses (a special file system, a path too long)."""
    where = f" ('{error.filename}')" if error.filename else ""
    return UserError(
        f"Cannot create '{dest}': {error.strerror or error}{where}; nothing was written.",
        "pass a new path (or an empty folder) in a folder you can write to, e.g. ~/my-task.",
    )


def is_checkout(root: Path, package: str = PACKAGE) -> bool:
    return (root / "pyproject.toml").is_file() and (root / "src" / package).is_dir()


def left_out_rooms(value: str) -> frozenset[str]:
    """The rooms named by --without: a comma-separated list of ROOMS' names, or `all`."""
    names = {part.strip() for part in value.split(",") if part.strip()}
    if "all" in names:
        return frozenset(ROOMS)
    unknown = sorted(names - set(ROOMS))
    if unknown or not names:
        rooms = f"the rooms are {', '.join(ROOMS)}" if ROOMS else "this copy has no optional room left"
        raise UserError(
            f"--without {value!r}: {', '.join(map(repr, unknown)) or 'nothing'} is not a room; {rooms}.",
            f"pass rooms separated by commas (e.g. --without {','.join(list(ROOMS)[:2])}), or --without all "
            "for the core alone; `new --help` says what each holds.",
        )
    return frozenset(names)


def marked_out(text: str, left_out: AbstractSet[str], rel: str) -> str:
    """`text` less the lines marked for the rooms left out; a marker that cannot be read is one error."""
    try:
        return without(text, left_out)
    except ValueError as e:
        raise UserError(
            f"'{rel}' has room markers that do not pair up ({e}); nothing was written.",
            "close each `room: NAME begin` with `room: NAME end` in that file (docs/new-task.md).",
        ) from None


def as_ours(rel: str, old: str) -> str:
    """A path of a template whose package is `old`, as this package's ROOMS name it (src/<package>/)."""
    return re.sub(rf"(^|/)src/{re.escape(old)}(/|$)", rf"\1src/{PACKAGE}\2", rel)


def create(
    dest: Path,
    name: str,
    root: Path = TEMPLATE_ROOT,
    old: str = PACKAGE,
    left_out: frozenset[str] = frozenset(),
) -> tuple[int, str | None]:
    """Write the renamed copy to `dest` via a temporary sibling, less the rooms `left_out`; return (files
    copied, commit or None). Without a checkout at `root`, the installed package's own copy of the
    template is used."""
    if root == TEMPLATE_ROOT and not is_checkout(root, old):
        with installed_template() as checkout:
            return create(dest, name, checkout, old, left_out)
    dest = Path(dest).absolute()
    check_name(name, old)
    try:
        check_dest(dest, root)
        return _create(dest, name, root, old, left_out)
    except OSError as e:
        raise cannot_write(dest, e) from None


def _create(dest: Path, name: str, root: Path, old: str, left_out: frozenset[str]) -> tuple[int, str | None]:
    """The copy itself, once the name and the destination are checked."""
    if not is_checkout(root, old):
        raise UserError(
            f"The template's sources are not at '{root}' (no pyproject.toml or src/{old}/).",
            "pass the root of a checkout of the template.",
        )
    files = [rel for rel in template_files(root) if not rooms_of(as_ours(rel, old)) & left_out]
    rules = renamer(old, name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # a prefix short enough for the file system's limit on a name, whatever DEST's length
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name[:32]}-", dir=dest.parent))
    # mkdtemp makes the folder private (0700); the copy is an ordinary folder, as mkdir would make it
    staging.chmod(0o777 & ~current_umask())
    try:
        for rel in files:
            # src/<old>/ and deploy/src/<old>/ (the serving install's links into src/<old>/)
            target = staging / re.sub(rf"(^|/)src/{re.escape(old)}/", rf"\1src/{name}/", rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            if internal_link(root / rel, root):
                target.symlink_to(rename_text(os.readlink(root / rel), rules))
                continue
            data = (root / rel).read_bytes()
            try:
                text = data.decode("utf-8")
                if not rel.endswith((".json", ".ipynb")):  # JSON has no comments to mark a line with
                    text = marked_out(text, left_out, rel)
                target.write_text(rename_text(text, rules), encoding="utf-8")
            except UnicodeDecodeError:  # binary: copied as it is
                target.write_bytes(data)
            shutil.copymode(root / rel, target)  # keeps .ci/run executable
        _tidy(staging)
        commit = _git_commit(staging, name)
        if dest.exists():
            dest.rmdir()  # empty (checked): replaced by the finished copy in one rename
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return len(files), commit


@contextmanager
def installed_template(package_dir: Path = PACKAGE_DIR) -> Iterator[Path]:
    """The installed package put back in a checkout's layout, in a temporary folder: its template/ at the
    top, its configs/ beside it, the package (without those two) under src/, and the links between."""
    template = package_dir / "template"
    if not (template / "pyproject.toml").is_file():
        raise UserError(
            f"This installed copy of {PACKAGE} has no template to copy ('{template}' is missing).",
            "reinstall it from a checkout (`pip install .` ships the template), or run `new` from a "
            "checkout of the template.",
        )
    with tempfile.TemporaryDirectory(prefix=f"{PACKAGE}-template-") as folder:
        root = Path(folder)
        for entry in template.iterdir():
            copy_entry(entry, root / RENAMED.get(entry.name, entry.name))
        shutil.copytree(package_dir / "configs", root / "configs", ignore=CACHES)
        src = root / "src" / package_dir.name
        shutil.copytree(
            package_dir,
            src,
            ignore=lambda d, names: [*CACHES(d, names), *(LINKED if Path(d) == package_dir else ())],
        )
        (src / "configs").symlink_to(Path("..", "..", "configs"))
        (src / "template").mkdir()
        for entry in template.iterdir():
            (src / "template" / entry.name).symlink_to(
                Path("..", "..", "..", RENAMED.get(entry.name, entry.name))
            )
        relink_serving_modules(root, package_dir.name)
        for kept in KEEP_ONLY_GITKEEP:
            (root / kept).mkdir()
            (root / kept / ".gitkeep").touch()
        yield root


def relink_serving_modules(root: Path, package: str) -> None:
    """deploy/src/<package> (the serving install) links into src/<package> in a checkout; a wheel holds
    copies of what they point to: each copy of a whole file or folder of src/<package> is a link again."""

    def relink(folder: Path, depth: int) -> None:
        for entry in sorted(folder.iterdir()):
            rel = entry.relative_to(root / "deploy" / "src" / package)
            original = root / "src" / package / rel
            whole = entry.is_file() or sorted(_walk(entry)) == sorted(_walk(original))
            if original.exists() and whole:
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                entry.symlink_to(Path(*[".."] * depth, "src", package, rel))
            elif entry.is_dir():
                relink(entry, depth + 1)

    served = root / "deploy" / "src" / package
    if served.is_dir():
        relink(served, 3)


CACHES = shutil.ignore_patterns("__pycache__", "*.pyc")


def copy_entry(source: Path, target: Path) -> None:
    """A file (with its mode) or a folder, without caches."""
    if source.is_dir():
        shutil.copytree(source, target, ignore=CACHES)
    else:
        shutil.copy2(source, target)


def current_umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _tidy(folder: Path) -> None:
    """Re-sort imports and re-wrap lines the new name made longer, when ruff is installed (else as is)."""
    ruff = shutil.which("ruff", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if ruff is None:
        return
    for args in (["check", "--fix", "--select", "I"], ["format"]):
        subprocess.run([ruff, *args, "--quiet", "--no-cache", "."], cwd=folder, capture_output=True)


def _git_commit(folder: Path, name: str) -> str | None:
    """`git init` and one commit; None when git is not installed."""
    git = shutil.which("git")
    if git is None:
        return None

    def run(*args: str) -> str:
        result = subprocess.run([git, *args], cwd=folder, capture_output=True, text=True)
        if result.returncode != 0:
            raise UserError(
                f"`git {' '.join(args)}` failed in the new project: {result.stderr.strip()}; "
                "nothing was written.",
                "fix git (or uninstall it to skip the commit) and run `new` again.",
            )
        return result.stdout.strip()

    run("init", "-q")
    has_identity = subprocess.run([git, "config", "user.email"], cwd=folder, capture_output=True).returncode
    identity = GIT_IDENTITY if has_identity != 0 else ()
    run("add", "-A")
    run(*identity, "-c", "commit.gpgsign=false", "commit", "-q", "--no-verify", "-m", f"Start {name}")
    return run("rev-parse", "--short", "HEAD")


def _goes_without(room: Room) -> str:
    return f" (left out with {' or '.join(room.needs)})" if room.needs else ""


@exits_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    width = max(map(len, [*ROOMS, "all"]))
    rooms = "\n".join(f"  {n:<{width}} {room.summary}{_goes_without(room)}" for n, room in ROOMS.items())
    parser = CommandParser(
        prog=f"python -m {PACKAGE} new",
        description=__doc__.split("\n\n")[0],
        epilog=f"optional rooms (--without):\n{rooms}\n  {'all':<{width}} every room: the core alone",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dest", type=Path, help="folder to create (must not exist, or be empty)")
    parser.add_argument("--name", required=True, help="the new package name, a Python identifier")
    parser.add_argument(
        "--without", default="", metavar="ROOM[,ROOM...]", help="optional rooms to leave out, or all"
    )
    args = parser.parse_args(argv)
    asked = left_out_rooms(args.without) if args.without else frozenset()
    left_out = with_dependents(asked)  # rooms that need a left-out one go with it
    if left_out - asked:
        print(f"Leaving out {', '.join(sorted(left_out - asked))} too: they need {', '.join(sorted(asked))}.")
    count, commit = create(args.dest, args.name, left_out=left_out)
    note = f"git commit {commit}" if commit else "no git repository: git is not installed"
    dest = printable(str(args.dest))  # a folder name could hold terminal control characters
    print(
        f"Created {args.name} in {dest} ({count} files; {note}). Next:\n"
        # quoted: a folder with spaces or `;` is one argument of cd, not more commands to paste
        f"  cd {printable(shlex.quote(str(args.dest)))} && python3 -m venv .venv && "
        ".venv/bin/pip install -q -e .\n"
        f"  .venv/bin/python -m {args.name} fit\n"
        f"Adapting it to your task: docs/new-task.md"
    )
