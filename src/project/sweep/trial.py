"""The fit side of a sweep trial: report the metric of each validation to the study, stop when pruned.

`python -m project sweep` adds this callback to each trial's fit and says which trial it is in the
environment (PROJECT_SWEEP_TRIAL: the storage URL stays out of the saved config, it may hold a password).

Not optuna_integration's PyTorchLightningPruningCallback: that one needs the Trial object in the fit's own
process and ends a pruned fit by raising TrialPruned out of Trainer.fit (a traceback, no orderly end of
logs). Here the trial belongs to the sweep process; the fit reaches it through the storage, and a pruned
fit stops like an early-stopped one: last checkpoint written, exit status 0. Under DDP only rank 0 talks
to the storage; its decision is broadcast so that every rank stops at the same epoch.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from project.errors import UserError

ENV = "PROJECT_SWEEP_TRIAL"
PRUNED_AT = "pruned_at_epoch"  # the trial's user attribute the sweep process reads after the fit


class SweepTrial(Callback):
    """Report `metric` of each validation epoch to the sweep's trial; stop the fit when the pruner says so."""

    def __init__(self) -> None:
        if ENV not in os.environ:
            raise UserError(
                "project.sweep.trial.SweepTrial reports to a `python -m project sweep` trial, "
                "and this fit was not started by one.",
                "remove it from trainer.callbacks (logs/<study>/best.yaml runs without it).",
            )
        self.spec: dict[str, Any] = json.loads(os.environ[ENV])
        self.trial: Any = None
        self.watching = False

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.watching and self.spec.get("parent") == os.getppid():
            _stop_when_orphaned(self.spec["parent"])
            self.watching = True
        if trainer.is_global_zero and self.trial is None:
            import optuna

            from project.sweep.settings import make_pruner, rdb_storage

            study = optuna.load_study(
                study_name=self.spec["study"],
                storage=rdb_storage(self.spec["storage"]),
                sampler=optuna.samplers.RandomSampler(),  # never samples here: the sweep process did
                pruner=make_pruner(self.spec["pruner"]),
            )
            self.trial = optuna.trial.Trial(study, self.spec["trial_id"])

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metric = self.spec["metric"]
        value = trainer.callback_metrics.get(metric)
        if value is None:
            logged = ", ".join(sorted(trainer.callback_metrics)) or "none"
            raise UserError(
                f"sweep.metric '{metric}' was not logged by this fit (logged: {logged}).",
                "set sweep.metric to one of the logged metrics, e.g. val/acc or val/loss.",
            )
        prune = False
        if trainer.is_global_zero and math.isfinite(float(value)):
            self.trial.report(float(value), step=trainer.current_epoch)
            prune = self.trial.should_prune()
            if prune:
                self.trial.set_user_attr(PRUNED_AT, trainer.current_epoch)
        if trainer.strategy.broadcast(prune, src=0):
            trainer.should_stop = True


def _stop_when_orphaned(parent: int) -> None:
    """SIGTERM this fit (GracefulStop: save last.ckpt, exit) once the sweep process that started it is gone.

    The sweep process may be SIGKILLed; its trial must not train on unobserved. (Polling rather than
    prctl(PR_SET_PDEATHSIG) in a preexec_fn, which is unsafe in the sweep's threaded process.)
    """

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sweep-parent-watch", daemon=True).start()
