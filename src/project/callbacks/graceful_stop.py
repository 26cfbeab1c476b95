"""Ctrl-C and SIGTERM (cluster preemption) during fit: finish the batch, save a resumable checkpoint, exit."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from typing_extensions import override


class Interrupted(SystemExit):
    """Raised at a batch boundary after SIGINT/SIGTERM; its code is 128 + the signal number."""


class GracefulStop(Callback):
    """On SIGINT or SIGTERM, stop after the current batch, save `last.ckpt` and exit with 130 or 143.

    A second Ctrl-C aborts at once without saving. Lightning's own SIGTERM handling (which stops at a
    batch boundary too, and exits 0) is kept; this callback adds Ctrl-C, the checkpoint and the exit code.
    Loader workers receive a group's signal too (Ctrl-C, `kill -- -PGID`, SLURM preemption): they block
    SIGINT/SIGTERM (data/worker_signals.py) and keep serving batches until the main process stops them.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._pid = os.getpid()

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return
        self.signum, self._pid = None, os.getpid()
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._on_signal)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore_handlers()

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked loader worker: its parent decides
            return
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: stop now, no checkpoint
        self.signum = signum
        print(
            f"\nReceived {signal.Signals(signum).name}: stopping after this batch and saving a checkpoint "
            "(press Ctrl-C again to abort without saving).",
            file=sys.stderr,
            flush=True,
        )

    def _stop_if_signalled(self, trainer: L.Trainer) -> None:
        signalled = self.signum is not None
        if trainer.world_size > 1:
            # every rank stops at the same batch, or the others wait in the next collective forever
            signalled = trainer.strategy.reduce_boolean_decision(signalled, all=False)
            if signalled and self.signum is None:
                self.signum = signal.SIGTERM  # another rank was signalled: stop (and save) with it
        if signalled:
            raise Interrupted(128 + self.signum)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._stop_if_signalled(trainer)

    @override
    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        # ranks may run one validation batch more or less (no repeated images): no collective here
        if trainer.state.fn == "fit" and trainer.world_size == 1:
            self._stop_if_signalled(trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_signalled(trainer)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore_handlers()  # Lightning calls no teardown hook after an exception
        if self.signum is None or not isinstance(exception, SystemExit):
            return
        # Lightning's own SIGTERMException would exit 0, which a scheduler reads as "done"
        exception.code = 128 + self.signum
        checkpoint = trainer.checkpoint_callback
        if not isinstance(checkpoint, ModelCheckpoint) or checkpoint.dirpath is None or trainer.fast_dev_run:
            return
        path = Path(checkpoint.dirpath) / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
        trainer.save_checkpoint(path, weights_only=False)  # the full training state, to resume
        if trainer.is_global_zero:
            print(
                f"Saved {path} (epoch {trainer.current_epoch}, step {trainer.global_step}). Resume with:\n"
                f"  python -m project fit --name {path.parent.name} --ckpt_path last",
                file=sys.stderr,
                flush=True,
            )
