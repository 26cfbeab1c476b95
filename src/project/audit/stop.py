"""The first Ctrl-C stops the audit at once, with one line and no traceback.

Lightning turns a KeyboardInterrupt inside `trainer.fit` into `sys.exit(1)` after ignoring every further
Ctrl-C, and a KeyboardInterrupt while loader workers read images prints a traceback from each process. So
the audit raises its own `Stopped`, a BaseException that Lightning passes on after its teardown (which
stops the loader workers). An exception raised by a signal handler can be lost: when the signal lands in an
at-fork hook or a `__del__` (a loader worker starting, say), Python prints "Exception ignored" and goes on.
So the handler also records the request, and `raise_if_stopped` raises it again at safe points (every batch
of the fold trainers, every chunk of images read). Inside a `__del__` (a loader iterator collected between
epochs), while a fork runs its hooks (logging's lock release after a loader worker starts) or while a
batch's file descriptor is handed over by a loader worker (multiprocessing's resource sharer: the worker's
side of the broken handshake prints a traceback) the handler only records it: raising there would print
that traceback, and could leave logging's lock held. Processes forked while the handler is installed
(loader workers, cleanlab's pool) inherit it and ignore the terminal's Ctrl-C: the main process stops them.
Files appear whole or not at all (`atomic_folder`, `atomic_write`), so stopping anywhere leaves nothing
half-written.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_sharer
from types import FrameType

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

_requested = False  # a Ctrl-C came during the block of stop_on_ctrl_c
_forking = False  # the parent is inside os.fork(), running the at-fork hooks


def _fork_starts() -> None:
    global _forking
    _forking = True


def _fork_ends() -> None:
    global _forking
    _forking = False


# Hooks run before a fork in reverse order of registration and after it in order, so these two enclose
# every hook registered before this module's import (logging's among them).
os.register_at_fork(before=_fork_starts, after_in_parent=_fork_ends, after_in_child=_fork_ends)


class Stopped(BaseException):
    """Raised in the main process on Ctrl-C (SIGINT); exit status 130 (128 + SIGINT)."""


def raise_if_stopped() -> None:
    """A safe point: raise `Stopped` if Ctrl-C was pressed, even when the handler's own raise was lost."""
    if _requested:
        raise Stopped


class StopPoint(Callback):
    """`raise_if_stopped` after every training and prediction batch of a fold trainer."""

    @override
    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        raise_if_stopped()

    @override
    def on_predict_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        raise_if_stopped()


def _unsafe(frame: FrameType | None) -> bool:
    """Whether the signal interrupted a `__del__`, where Python would print an exception and drop it, or a
    loader worker handing over a batch's file descriptor, whose other end would print one."""
    while frame is not None:
        if frame.f_code.co_name == "__del__" or frame.f_code.co_filename == resource_sharer.__file__:
            return True
        frame = frame.f_back
    return False


@contextmanager
def stop_on_ctrl_c() -> Iterator[None]:
    """Within the block, SIGINT raises `Stopped` (every time: a second Ctrl-C during the cleanup too)."""
    global _requested
    pid = os.getpid()
    previous = signal.getsignal(signal.SIGINT)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        global _requested
        if os.getpid() != pid:  # a forked child: its parent stops it
            return
        _requested = True
        if not _forking and not _unsafe(frame):  # else the next safe point raises
            raise Stopped

    _requested = False
    signal.signal(signal.SIGINT, on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _requested = False
