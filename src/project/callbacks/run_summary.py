"""The block `fit` ends with (finished or interrupted): where the run went and the commands to use it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import BatchSizeFinder, Callback, LearningRateFinder, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from project.callbacks.export import ExportBest
from project.callbacks.graceful_stop import Interrupted

# room: trackers begin
from project.callbacks.trackers import links

# room: trackers end
from project.terminal import printable


class RunSummary(Callback):
    """After fit (and after Ctrl-C/SIGTERM, once GracefulStop saved `last.ckpt`), on rank 0: the run's
    folders, the best score and its checkpoint, the last checkpoint, the export, and the next commands."""

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # after every callback's on_fit_end (ExportBest's export); Lightning skips it after an exception
        if stage == "fit":
            self._print(trainer, "finished")

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # Lightning's loops check a SIGTERM flag of their own after the batch-end hooks: a signal landing
        # between GracefulStop's check and theirs raises their SIGTERMException, which GracefulStop
        # (earlier in the callbacks) has given the same exit status and checkpoint
        if isinstance(exception, Interrupted | SIGTERMException):
            self._print(trainer, f"stopped (exit status {exception.code})")

    def _print(self, trainer: L.Trainer, how: str) -> None:
        tuning = any(isinstance(c, BatchSizeFinder | LearningRateFinder) for c in trainer.callbacks)
        if not trainer.is_global_zero or trainer.fast_dev_run or tuning:  # lr_find runs a fit of its own
            return
        print(summary(trainer, how), file=sys.stdout, flush=True)


def summary(trainer: L.Trainer, how: str) -> str:
    """The block's text, with the run's real paths (relative to the working folder when inside it)."""
    checkpoint = trainer.checkpoint_callback
    if not isinstance(checkpoint, ModelCheckpoint) or checkpoint.dirpath is None:
        return f"Run {how} (no checkpoints were kept)."
    folder = Path(checkpoint.dirpath)
    run = trainer.logger.name if trainer.logger is not None and trainer.logger.name else folder.name
    # the logger's own folder: Trainer.log_dir broadcasts, a collective that only rank 0 reaches here
    logs = getattr(trainer.logger, "log_dir", None)
    last = folder / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
    best = checkpoint.best_model_path
    lines = [f"Run '{run}' {how} at epoch {trainer.current_epoch}, step {trainer.global_step}."]
    if logs:
        lines.append(f"  logs:         {shown(logs)}/   (TensorBoard events, config.yaml)")
    lines += [f"  {tracker + ':':<13} {address}" for tracker, address in links(trainer)]  # room: trackers
    lines.append(f"  checkpoints:  {shown(folder)}/")
    if best and checkpoint.best_model_score is not None:
        score = f"{checkpoint.monitor} {float(checkpoint.best_model_score):.4f}"
        lines.append(f"  best:         {score}  {shown(best)}")
    if last.exists():
        lines.append(f"  last:         {shown(last)}")
    exported = next((c.exported for c in trainer.callbacks if isinstance(c, ExportBest) and c.exported), None)
    latest = folder / "latest.onnx"
    if exported is not None:
        lines.append(f"  export:       {shown(exported)}")
        lines.append(f"                {shown(latest)} -> {exported.name}")
    lines.append("Next:")
    if logs:
        lines.append(f"  tensorboard --logdir {shown(Path(logs).parent)}")
        # room: report begin
        lines.append(f"  python -m project report {run}")
        # room: report end
    if best or last.exists():
        model = shown(best or last)
        lines.append(f"  python -m project predict --ckpt_path {model} --data.predict_dir=IMAGES")
    if exported is not None:
        lines.append(f"  python -m project infer --model {shown(latest)} IMAGES")
        # room: serve begin
        lines.append(f"  python -m project serve --model {shown(latest)}")
        # room: serve end
    if how != "finished" and last.exists():
        lines.append(f"  python -m project fit --name {run} --ckpt_path last   # resume")
    return printable_block(lines)


def shown(path: str | os.PathLike) -> str:
    """`path` relative to the working folder when it is inside it (what a user types), else absolute."""
    absolute = Path(path).absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def printable_block(lines: list[str]) -> str:
    return "\n".join(printable(line) for line in lines)
