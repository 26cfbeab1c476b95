"""Run names: one name ties logs/<name> and checkpoints/<name> together; no run overwrites another."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from pathlib import Path

from project.errors import UserError

try:
    import fcntl
except ImportError:  # Windows: no run locks
    fcntl = None

LOGS = Path("logs")
CHECKPOINTS = Path("checkpoints")
# Lightning starts DDP ranks > 0 as new processes of the same command; they take the name rank 0 chose.
RUN_NAME_ENV = "PROJECT_RUN_NAME"
LOCK = ".lock"  # logs/<name>/.lock, held (a POSIX record lock) by the one process that writes the run
_held: dict[Path, int] = {}  # lock file (absolute) -> its open descriptor, kept while the run is ours
_folders: dict[Path, tuple[Path, Path]] = {}  # lock file -> the run's logs and checkpoints folders (absolute)


def check_run_name(name: str | None) -> None:
    """A run name is a folder name, or `group/run` (a sweep's trials): it never leads out of logs/ and
    checkpoints/."""
    if name is None:
        return
    parts = name.split("/")
    bad = len(parts) > 2 or any(not p or p in (".", "..") or "\\" in p or "\0" in p for p in parts)
    if bad:
        raise UserError(
            f"--name={name!r} is not a run name: it must be a folder name, or two joined by '/' "
            "(no '\\', NUL, leading or doubled '/', '.' or '..'), since logs/<name> and "
            "checkpoints/<name> are made from it.",
            "pick a plain name such as --name=resnet18-lr0.01 or --name=ablation/lr0.01 "
            "(runs are the folders in checkpoints/).",
        )


def fit_run_name(name: str | None, ckpt_path: str | None) -> str:
    """The run a `fit` writes to: new and unused, or the one `--ckpt_path` resumes."""
    check_run_name(name)
    if os.environ.get("LOCAL_RANK", "0") != "0" and RUN_NAME_ENV in os.environ:
        return os.environ[RUN_NAME_ENV]
    world_size, rank = launcher_world()
    if world_size > 1:
        # torchrun or SLURM started every process (every node) with this command: only a given
        # name is the same everywhere, and only rank 0 may judge whether it is already taken
        if name is None:
            raise UserError(
                f"This fit runs as {world_size} processes started by a launcher (torchrun, srun), "
                "which cannot agree on a time-stamped run name.",
                "pass the same --name to every node, e.g. --name=my-run.",
            )
        if rank != 0:
            return name
    if ckpt_path == "last":
        name = name or newest_run()
        if not any((CHECKPOINTS / name).glob("last*.ckpt")):
            raise UserError(
                f"--ckpt_path last: run '{name}' has no last checkpoint in '{CHECKPOINTS / name}'.",
                "check --name (runs are the folders in checkpoints/), "
                "or start a new run without --ckpt_path.",
            )
        lock_run(name)
    elif ckpt_path is not None:
        name = name or run_of_checkpoint(ckpt_path) or new_run_name()
        lock_run(name)
    elif name is None:
        name = new_run_name()
    else:
        _refuse_used(name)  # before locking: a refused name gets no lock file
        lock_run(name)
        _refuse_used(name)  # created by another process in between
    os.environ[RUN_NAME_ENV] = name
    return name


def debug_run_name(name: str | None, ckpt_path: str | None) -> str:
    """A `fast_dev_run` fit writes nothing, so it claims no run (no lock file); it may read one to resume."""
    check_run_name(name)
    if ckpt_path == "last":
        return name or newest_run()
    return name or (run_of_checkpoint(ckpt_path) if ckpt_path else None) or "fast_dev_run"


def _refuse_used(name: str) -> None:
    if _used(name):
        unlock_run(name)
        raise UserError(
            f"Run '{name}' already exists ({CHECKPOINTS / name} or {LOGS / name}); "
            "a new run never overwrites it.",
            f"resume it with --name {name} --ckpt_path last, or pick another --name.",
        )


def launcher_world() -> tuple[int, int]:
    """(world size, global rank) set by torchrun (WORLD_SIZE, RANK) or SLURM (SLURM_NTASKS, SLURM_PROCID)."""
    for size, rank in (("WORLD_SIZE", "RANK"), ("SLURM_NTASKS", "SLURM_PROCID")):
        if size in os.environ:
            return int(os.environ[size]), int(os.environ.get(rank, "0"))
    return 1, 0


def eval_run_name(name: str | None, ckpt_path: str | None) -> str:
    """validate/test/predict log next to the run their checkpoint came from, or to a new run."""
    check_run_name(name)
    return name or (run_of_checkpoint(ckpt_path) if ckpt_path else None) or new_run_name()


def new_run_name() -> str:
    """A time stamp, with a counter when two runs start in the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name, n = stamp, 1
    while _used(name) or not _try_lock(name):  # a run started at the same second by another process
        name, n = f"{stamp}-{n}", n + 1
    return name


def lock_run(name: str) -> None:
    """Claim run `name` for this process, or fail naming the process that has it.

    A POSIX record lock (`lockf`): the kernel drops it when the process ends, even by SIGKILL, so a
    crashed run never leaves a stale lock. Unlike an `flock`, forked loader workers do not share it:
    they outlive a killed parent by up to 5 s, and a resume right after the kill must not wait for them.
    (A record lock is also dropped when this process closes any descriptor of the file: only `_held`
    opens it.)
    """
    if not _try_lock(name):
        owner = _lock_path(name).read_text(errors="replace").strip() or "another process"
        raise UserError(
            f"Run '{name}' is being written by {owner}; two fits of one run would overwrite "
            "each other's checkpoints and logs.",
            f"wait for that fit to end (or stop it), then resume with --name {name} --ckpt_path last; "
            "or start a separate run with another --name.",
        )


def unlock_run(name: str) -> None:
    _folders.pop(_lock_path(name).absolute(), None)
    fd = _held.pop(_lock_path(name).absolute(), None)
    if fd is not None:
        os.close(fd)  # closing the file releases the lock


def release_runs() -> None:
    """Give back every run this process holds, as its command ends: the lock file goes, and so does a run
    folder left empty (a fit refused or failed before writing anything), so such a run leaves no trace."""
    for path in list(_held):
        fd = _held.pop(path)
        # removed while still locked: a process that opened the file before sees it gone (_try_lock)
        path.unlink(missing_ok=True)
        os.close(fd)
        for folder in _folders.pop(path, ()):
            with contextlib.suppress(OSError):  # not there, or not empty: the run's files stay
                folder.rmdir()


def _try_lock(name: str) -> bool:
    path = _lock_path(name)
    if path.absolute() in _held or fcntl is None:
        return True
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the empty folder went with a run given back in between (release_runs)
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):  # another process holds it
                return False
            raise
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder removed it as it ended (release_runs): lock the file now at that path
    os.ftruncate(fd, 0)
    os.pwrite(
        fd, f"process {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}".encode(), 0
    )
    _held[path.absolute()] = fd
    _folders[path.absolute()] = ((LOGS / name).absolute(), (CHECKPOINTS / name).absolute())
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (found.st_dev, found.st_ino)


def _lock_path(name: str) -> Path:
    return LOGS / name / LOCK


def newest_run() -> str:
    runs = [*CHECKPOINTS.glob("*/last*.ckpt"), *CHECKPOINTS.glob("*/*/last*.ckpt")]
    if not runs:
        raise UserError(
            f"--ckpt_path last: there is no run to resume in '{CHECKPOINTS}'.",
            "train first with `python -m project fit`, or pass --ckpt_path PATH to a checkpoint file.",
        )
    return max(runs, key=lambda p: p.lstat().st_mtime).parent.relative_to(CHECKPOINTS).as_posix()


def run_of_checkpoint(ckpt_path: str) -> str | None:
    """`checkpoints/<name>/x.ckpt` -> name (`group/run` one level deeper); None for a file from elsewhere."""
    folder = Path(ckpt_path).absolute().parent
    for parent, name in (
        (folder.parent, folder.name),
        (folder.parent.parent, f"{folder.parent.name}/{folder.name}"),
    ):
        if parent == CHECKPOINTS.absolute():
            return name
    return None


def _used(name: str) -> bool:
    """The run has files (its lock file aside)."""
    return any(
        p.is_dir() and any(f.name != LOCK for f in p.iterdir()) for p in (CHECKPOINTS / name, LOGS / name)
    )
