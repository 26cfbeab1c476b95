"""What the experiment trackers (MLflow, W&B) get besides the scalars: the data check's tables when they are
made, and when fit ends the best checkpoint's name and score, the export and the report's pictures."""

from __future__ import annotations

import contextlib
import io  # room: report
import shutil
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import (
    Logger,
    MLFlowLogger,
    TensorBoardLogger,  # room: report
    WandbLogger,
)
from lightning.pytorch.utilities import rank_zero_warn  # room: report
from typing_extensions import override

from project.callbacks.export import ExportBest

# room: report begin
from project.errors import UserError

# room: report end
from project.terminal import without_credentials


class TrackerArtifacts(Callback):
    """When fit ends, on rank 0: each MLflow or W&B logger gets the best checkpoint's name (a tag, or the
    summary) and score (`best/<monitor>`), the export (`export/`: ONNX + JSON sidecar) and the report's
    pictures (`report/`). Nothing happens without such a logger."""

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # after every callback's on_fit_end (ExportBest's export), before Lightning closes the loggers;
        # Lightning skips it after an exception
        trackers = tracker_loggers(trainer)
        if stage != "fit" or not trackers or not trainer.is_global_zero or trainer.fast_dev_run:
            return
        checkpoint = trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_path:
            score = checkpoint.best_model_score
            for logger in trackers:
                send_best(logger, Path(checkpoint.best_model_path).name, checkpoint.monitor, score)
        files = [(path, "export") for path in export_files(trainer)]
        stack = contextlib.ExitStack()  # what the files need until they are sent (a temporary folder)
        with stack:
            # room: report begin
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            files += [(path, "report") for path in report_pictures(trainer, folder)]
            # room: report end
            for logger in trackers:
                for path, where in files:
                    upload(logger, path, where)


def tracker_loggers(trainer: L.Trainer) -> list[Logger]:
    """The trainer's MLflow and W&B loggers (those that keep files as well as scalars)."""
    return [logger for logger in trainer.loggers if isinstance(logger, MLFlowLogger | WandbLogger)]


def links(trainer: L.Trainer) -> list[tuple[str, str]]:
    """(tracker, address) of each run on an MLflow server, without credentials (W&B prints its own)."""
    found = []
    for logger in trainer.loggers:
        if not isinstance(logger, MLFlowLogger):
            continue
        # private MLFlowLogger state, checked against lightning 2.6: the public properties would start a
        # run where none was started
        uri, experiment, run = logger._tracking_uri or "", logger._experiment_id, logger._run_id
        if run and uri.startswith(("http://", "https://")):
            base = without_credentials(uri).rstrip("/")
            found.append(("mlflow", f"{base}/#/experiments/{experiment}/runs/{run}"))
    return found


def send_text(trainer: L.Trainer, name: str, text: str) -> None:
    """`text` as the file `<name>.txt` of every tracker's run (the data check's tables)."""
    trackers = tracker_loggers(trainer) if trainer.is_global_zero else []
    if not trackers:
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{Path(name).name}.txt"
        path.write_text(text + "\n", encoding="utf-8")
        for logger in trackers:
            upload(logger, path, str(Path(name).parent))


def send_best(logger: Logger, name: str, monitor: str | None, score: Any) -> None:
    """The best checkpoint's file name, and its score as the metric `best/<monitor>`."""
    if isinstance(logger, MLFlowLogger):
        logger.experiment.set_tag(logger.run_id, "best_checkpoint", name)
    elif isinstance(logger, WandbLogger):
        logger.experiment.summary["best_checkpoint"] = name
    if monitor and score is not None:
        logger.log_metrics({f"best/{monitor}": float(score)})


def upload(logger: Logger, path: Path, folder: str) -> None:
    """`path` as `<folder>/<its name>` among the run's files (MLflow artifacts, W&B run files)."""
    if isinstance(logger, MLFlowLogger):
        logger.experiment.log_artifact(logger.run_id, str(path), artifact_path=folder or None)
    elif isinstance(logger, WandbLogger):
        run = logger.experiment
        copy = Path(run.dir) / folder / path.name  # W&B keeps a file's path below base_path
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
        run.save(str(copy), base_path=run.dir, policy="now")


def export_files(trainer: L.Trainer) -> list[Path]:
    """The ONNX file ExportBest wrote when fit ended, and its sidecar."""
    exported = next((c.exported for c in trainer.callbacks if isinstance(c, ExportBest) and c.exported), None)
    if exported is None:
        return []
    return [path for path in (exported, exported.with_suffix(".json")) if path.is_file()]


# room: report begin
def report_pictures(trainer: L.Trainer, folder: Path) -> list[Path]:
    """The pictures `python -m project report` draws of this run, written into `folder`."""
    from project.report import report  # matplotlib and TensorBoard's event reader: only when needed

    tensorboard = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
    if tensorboard is None:
        return []
    tensorboard.experiment.flush()  # the report reads the event files
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its "written to" lines are not this run's
            report(tensorboard.log_dir, str(folder / "report.png"))
    except (UserError, OSError, ValueError) as e:
        rank_zero_warn(f"The report's pictures were not sent to the trackers: {e}")
        return []
    return sorted(folder.glob("*.png"))


# room: report end
