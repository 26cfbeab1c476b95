"""Checkpoint files: written atomically (a kill or a full disk never leaves a half file under a final
name), in the background, and read weights-only (a checkpoint from elsewhere cannot run code when it
is loaded).

Saving takes the state at once (`torch.save` to memory, on the training thread); writing those bytes
to the disk (write, fsync, rename: most of a save's time) happens on one background thread while
training goes on. That thread also does the removals Lightning asks for, in order, so an old
checkpoint is never deleted before the one replacing it is complete, and after a failed write
nothing more is written or removed: the failure is raised on the training thread at the next save,
removal or load, or when the trainer tears down (before `on_fit_end`, so what runs then, the export
of the best checkpoint, reads complete files).

A removal is the file's alone: a path that is not a file (a folder, whatever Lightning's own
`fs.rm(recursive=True)` would take whole), or not directly in one of the run's checkpoint folders
(`folders`, which the Trainer sets), is left in place with a warning. Those paths come from a
checkpoint's callback state, which may have been written anywhere (project.callbacks.checkpoint_paths).
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import re
import shutil
import warnings
import zipfile
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

# private Lightning API, checked against lightning 2.6 (the pin is <2.7)
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from project.atomic import atomic_write
from project.errors import UserError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(UserError):
    """A checkpoint that did not fit on the disk: nothing under its name was written."""


class UnsafeCheckpointError(UserError):
    """A checkpoint holding pickled objects other than tensors and plain values: refused, nothing ran."""


# Writes and removals queued at most, each write holding a whole checkpoint's bytes in memory.
MAX_PENDING = 2


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's TorchCheckpointIO, but saves go through a temporary file + fsync + rename (on a
    background thread unless `background` is false), and every load is weights-only whatever the
    caller asks (Lightning passes weights_only=None)."""

    def __init__(self, background: bool = True) -> None:
        """
        Args:
            background: Write (and remove) files on a background thread; false: before returning.
        """
        super().__init__()
        self.background = background
        self._thread: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._error: BaseException | None = None
        # the checkpoint folders of the run (ModelCheckpoint.dirpath, known once the trainer is set up);
        # None: this IO is used without our Trainer, and only the is-a-file test applies
        self.folders: Callable[[], Iterable[str]] | None = None
        # where Lightning's Tuner keeps its restore checkpoint (the trainer's default_root_dir)
        self.tuner_folder: Callable[[], str] | None = None

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            self.wait()
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote: fsspec's transaction
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)  # the state now: training may change the tensors once this returns
        self._run(_write, path, buffer)

    @override
    def remove_checkpoint(self, path: Any) -> None:
        if not _is_local_file_protocol(path):
            return self._run(super().remove_checkpoint, path)
        path = Path(path)
        if self.folders is None:
            folders = None
        else:
            folders = {os.path.realpath(f) for f in self.folders()}
            if self.tuner_folder is not None and TUNER_FILE.fullmatch(path.name):
                folders.add(os.path.realpath(self.tuner_folder()))
        self._run(_remove_file, path, folders)

    def wait(self) -> None:
        """Block until every write and removal asked for is done; raise the first that failed."""
        for future in self._pending:
            future.result()
        self._pending = []
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    @override
    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=True)
                self._thread = None

    def _run(self, task: Any, *args: Any) -> None:
        """`task(*args)` on the writer thread, after the ones before it; at once when not in background."""
        if self._error is not None:  # an earlier write failed: stop here, with its error
            self.wait()
        if not self.background:
            return task(*args)
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending = [f for f in self._pending if not f.done()]
        while len(self._pending) >= MAX_PENDING:  # bounded memory: a slow disk holds back training instead
            self._pending.pop(0).result()
        self._pending.append(self._thread.submit(self._guarded, task, *args))

    def _guarded(self, task: Any, *args: Any) -> None:
        if self._error is not None:  # after a failed write nothing more is written or removed
            return
        try:
            task(*args)
        except BaseException as e:
            self._error = e

    @override
    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict:
        self.wait()  # a checkpoint being written is read whole
        # Lightning calls this without map_location: tensors then load onto the CPU (as in Lightning's
        # own TorchCheckpointIO), never onto the device that wrote them, which this machine may lack;
        # the strategy moves the restored model where it runs
        map_location = "cpu" if map_location is None else map_location
        if not _is_local_file_protocol(path):
            return super().load_checkpoint(path, map_location, weights_only=True)
        if not Path(path).is_file():
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        return load_checkpoint_file(path, map_location=map_location)


def _write(path: Path, buffer: io.BytesIO) -> None:
    try:
        atomic_write(path, buffer.getbuffer())
    except OSError as e:
        if e.errno in DISK_FULL:
            raise disk_full(path, buffer.getbuffer().nbytes) from None
        raise


# the restore checkpoint that Lightning's Tuner (lr_find, scale_batch_size) saves before its search in
# the trainer's default_root_dir and removes after it
TUNER_FILE = re.compile(r"\.(lr_find|scale_batch_size)_[0-9a-f-]+\.ckpt")


def _remove_file(path: Path, folders: set[str] | None) -> None:
    """Remove the file (or symlink) `path` if it lies directly in one of `folders`; else warn and keep it."""
    if not os.path.lexists(path):
        return
    if not (path.is_symlink() or path.is_file()):
        reason = "it is not a file"
    elif folders is not None and os.path.realpath(path.parent) not in folders:
        reason = f"it is outside the run's checkpoint folder ({', '.join(sorted(folders)) or 'none'})"
    else:
        path.unlink()  # a symlink (`last.ckpt` with save_last="link"): the link, never its target
        return
    warnings.warn(f"Checkpoint removal of '{path}' refused: {reason}. It was left in place.", stacklevel=1)


def disk_full(path: Path, size: int) -> DiskFullError:
    free = shutil.disk_usage(path.parent).free
    return DiskFullError(
        f"No space left on the disk to write checkpoint '{path}' ({_mb(size)} needed, {_mb(free)} free). "
        f"Nothing was written under that name; the checkpoints already in '{path.parent}' are intact.",
        f"free at least {_mb(size - free)} on that disk (old runs in checkpoints/ and logs/, exports, "
        f"caches) or set --checkpoint.dirpath to a disk with room, then resume with "
        f"--name {path.parent.name} --ckpt_path last.",
    )


def _mb(size: int) -> str:
    return f"{max(size, 0) / 2**20:.1f} MB"


def load_checkpoint_file(path: str | Path, map_location: Any = "cpu") -> dict:
    """torch.load with weights_only=True; a refused or unreadable file ends in one message naming it."""
    check_declared_sizes(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        culprit = re.search(r"GLOBAL (\S+)|Unsupported operand \d+", str(e))
        what = f" ({culprit.group(1) or culprit.group(0)})" if culprit else ""
        raise UnsafeCheckpointError(
            f"Refused to load checkpoint '{path}': it holds pickled code or objects{what}, not only tensors "
            "and plain values, so loading it could run code. Nothing in it was executed.",
            "use a checkpoint written by this project (or torch.save of a state dict) from a source "
            "you trust.",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, IndexError) as e:  # IndexError: a few bytes of text
        raise UserError(
            f"Cannot read checkpoint '{path}': {str(e).splitlines()[0] if str(e) else type(e).__name__}.",
            "the file is truncated or not a torch checkpoint; pass another one (a run keeps its "
            "checkpoints in checkpoints/<run>/).",
        ) from None


def cached_weights_error(path: str | Path, label: str, error: Exception, fix: str) -> UserError:
    """The one message for pretrained weights in a download cache (torch hub's, the Hugging Face hub's)
    that a weights-only load refused (`pickle.UnpicklingError`: nothing ran) or could not read.

    Args:
        path: the cached file.
        label: which weights it holds, for the message (`resnet18.a1_in1k`, `squeezenet1_1 DEFAULT`).
        error: what the weights-only load raised.
        fix: how to get the genuine file back (it is downloaded again once deleted).
    """
    if isinstance(error, pickle.UnpicklingError):
        culprit = re.search(r"GLOBAL (\S+)", str(error))
        return UserError(
            f"Refused to load the cached weights '{path}' ({label}): the file holds pickled code or "
            f"objects{f' ({culprit.group(1)})' if culprit else ''}, not only tensors, so loading it could "
            "run code. Nothing in it was executed.",
            fix,
        )
    return UserError(f"Cannot read the cached weights '{path}' ({label}): {str(error).splitlines()[0]}.", fix)


CHECKPOINT_FIX = (
    "use a checkpoint written by this project or torch.save (it stores tensors uncompressed), from a "
    "source you trust."
)


def check_declared_sizes(path: str | Path, name: str | None = None, fix: str = CHECKPOINT_FIX) -> None:
    """Refuse a zip checkpoint whose entries declare more bytes than the file holds, before torch.load.

    Every load of a torch file goes through it: checkpoints, --model.weights files, and the weights
    in the torchvision and Hugging Face caches (`name` says which in the message: default
    "checkpoint '<path>'"; `fix`, how to get a good file).

    torch.load allocates each tensor's storage at its entry's declared size and then fills it, so a
    584 kB file with a deflated entry took 600 MB (a 6 MB one, 6 GiB). torch.save stores entries
    uncompressed, so the data of a real checkpoint never exceeds its file. Files that are not zips
    (torch's legacy format, which checks its sizes before allocating; garbage) are left to torch.load.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            declared = sum(entry.file_size for entry in archive.infolist())
        size = os.path.getsize(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return
    if declared > size:
        name = name or f"checkpoint '{path}'"
        raise UserError(
            f"Refused to load {name}: its entries declare {declared:,} "
            f"bytes of data, more than the file's {size:,} bytes (compressed or false sizes, each "
            "allocated in full before it is read). Nothing was loaded.",
            fix,
        )
