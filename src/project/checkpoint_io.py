"""Checkpoint files: written atomically (a kill or a full disk never leaves a half file under a final
name) and read weights-only (a checkpoint from elsewhere cannot run code when it is loaded)."""

from __future__ import annotations

import errno
import io
import pickle
import re
import shutil
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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's TorchCheckpointIO, but saves go through a temporary file + fsync + rename, and every
    load is weights-only whatever the caller asks (Lightning passes weights_only=None)."""

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote: fsspec's transaction
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        try:
            atomic_write(path, buffer.getbuffer())
        except OSError as e:
            if e.errno in DISK_FULL:
                raise disk_full(path, buffer.getbuffer().nbytes) from None
            raise

    @override
    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict:
        # Lightning calls this without map_location: tensors then load onto the CPU (as in Lightning's
        # own TorchCheckpointIO), never onto the device that wrote them, which this machine may lack;
        # the strategy moves the restored model where it runs
        map_location = "cpu" if map_location is None else map_location
        if not _is_local_file_protocol(path):
            return super().load_checkpoint(path, map_location, weights_only=True)
        if not Path(path).is_file():
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        return load_checkpoint_file(path, map_location=map_location)


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
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise UserError(
            f"Cannot read checkpoint '{path}': {str(e).splitlines()[0] if str(e) else type(e).__name__}.",
            "the file is truncated or not a torch checkpoint; pass another one (a run keeps its "
            "checkpoints in checkpoints/<run>/).",
        ) from None
