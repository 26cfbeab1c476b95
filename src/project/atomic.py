"""Files that appear under their name only when complete: temporary file, fsync, rename, fsync the folder.

Every such write in the project goes through here: `atomic_files` (write to the yielded temporary paths),
`atomic_write` (bytes), `atomic_folder` (a whole folder) and `atomic_symlink` (repoint a link).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def partial_path(path: Path) -> Path:
    """A temporary name next to `path`, this writer's own: hidden, never matched by `*.ckpt` or `last*`.

    Unique per call, so two processes writing one file at once (two sweeps summarizing one study) each
    rename a complete file of their own instead of one renaming the other's away.
    """
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")


@contextmanager
def atomic_files(*paths: str | os.PathLike) -> Iterator[list[Path]]:
    """Yield a hidden temporary path beside each of `paths` to write; when the block completes, each
    file is fsynced and renamed to its path, in the order given (a sidecar listed last appears last).

    On any failure (a full disk, a signal) the temporary files are removed and the error re-raised;
    only a process killed outright leaves them behind, under their hidden names (`remove_partials`).

        with atomic_files(output) as [partial]:
            partial.write_text(text)
    """
    finals = [Path(path) for path in paths]
    partials = [partial_path(path) for path in finals]
    try:
        yield partials
        for partial, final in zip(partials, finals, strict=True):
            fsync_file(partial)  # the bytes are on disk before the name points at them
            os.replace(partial, final)
    finally:
        for partial in partials:
            partial.unlink(missing_ok=True)  # gives a full disk its space back
    for folder in dict.fromkeys(final.parent for final in finals):
        fsync_dir(folder)


def atomic_write(path: str | os.PathLike, data: bytes | memoryview) -> None:
    """Write `data` to `path` so that readers see the old file or the whole new one, never a part."""
    with atomic_files(path) as [partial]:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[_write(fd, view) :]
        finally:
            os.close(fd)


def atomic_symlink(link: Path, target: str) -> None:
    """Make `link` a relative symlink to `target`, replacing it atomically (rollback: point it back)."""
    staging = link.with_name(f".{link.name}.new")
    staging.unlink(missing_ok=True)
    staging.symlink_to(target)
    os.replace(staging, link)


def _write(fd: int, data: memoryview) -> int:
    return os.write(fd, data)  # one place to simulate a full disk in tests


def fsync_file(path: Path) -> None:
    """Flush a written file's bytes to the disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (a crash right after it could otherwise undo it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders; the rename is still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_partials(folder: Path) -> list[Path]:
    """Delete the temporary files a killed writer left in `folder`; call only while no one writes there."""
    stale = sorted(folder.glob(".*.partial")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


@contextmanager
def atomic_folder(root: Path) -> Iterator[Path]:
    """Fill the yielded hidden folder beside `root`; it becomes `root` only if the block completes.

    When another process made `root` first, its copy is kept. The staging folder never outlives the block.
    """
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        yield staging
        try:
            os.replace(staging, root)
        except OSError:
            if not root.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
