"""Learning-rate schedules that torch does not ship as one class."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


class WarmupCosineLR(LambdaLR):
    """Linear warm-up from 0 over `warmup_steps`, then cosine decay to `min_lr_ratio` x lr at `total_steps`.

    Stepped once per optimizer step. `total_steps=None` means the whole run: the model fills it in
    from `trainer.estimated_stepping_batches`, so max_epochs, accumulation and devices are all counted.
    Such a derived length is left out of checkpoints, so a resumed run with more epochs stretches the
    schedule instead of sitting at its end.

    The warm-up takes at most `max_warmup_fraction` of the run's steps: a short run (a small folder, a
    few epochs) reaches its learning rate instead of ending still warming up. Under a time budget
    (`--trainer.max_time`) the model also gives a clock, the elapsed share of the budget: the run's
    length is then the fewer of `total_steps` and the steps the budget allows at the pace so far, so
    the schedule ends annealed when the time runs out rather than being cut mid-cosine.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int = 0,
        total_steps: int | None = None,
        min_lr_ratio: float = 0.0,
        max_warmup_fraction: float = 0.1,
        last_epoch: int = -1,
    ) -> None:
        """
        Args:
            optimizer: The optimizer whose learning rates this schedules.
            warmup_steps: Optimizer steps of linear warm-up (at most `max_warmup_fraction` of the run).
            total_steps: The run's optimizer steps; None: the whole run, as the trainer counts it.
            min_lr_ratio: The learning rate at the end, as a fraction of the peak.
            max_warmup_fraction: The warm-up's largest share of the run's steps.
            last_epoch: The index of the last step taken (-1: none), as in every torch scheduler.
        """
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.derived_total = total_steps is None
        self.min_lr_ratio = min_lr_ratio
        self.max_warmup_fraction = max_warmup_fraction
        self.clock: Callable[[], float] | None = None
        self._first: tuple[int, float] | None = None  # (step, share of the budget) where the pace starts
        super().__init__(optimizer, self.factor, last_epoch)

    def fit_run(self, total_steps: int | None, clock: Callable[[], float] | None = None) -> None:
        """The run's length (when `total_steps` was None) and its time budget's clock (the elapsed share of
        `--trainer.max_time`, 0 to 1); the current learning rate follows them at once."""
        if self.derived_total:
            self.total_steps = total_steps
        self.clock = clock
        self._first = None
        lrs = [base * self.factor(self.last_epoch) for base in self.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self._last_lr = lrs

    def length(self, step: int) -> int | None:
        """The run's steps as far as they are known at `step`: the step count, or the time budget's pace."""
        if self.clock is None or step < 1:
            return self.total_steps
        share = self.clock()
        if self._first is None:  # the pace is measured from here: start-up is not a step's time
            self._first = (step, share)
        first_step, first_share = self._first
        if step == first_step or share <= first_share:
            return self.total_steps
        per_step = (share - first_share) / (step - first_step)
        in_time = step + max(0, math.ceil((1 - share) / per_step))  # the steps the budget allows
        return in_time if self.total_steps is None else min(self.total_steps, in_time)

    def factor(self, step: int) -> float:
        total = self.length(step)
        warmup = self.warmup_steps
        if total is not None:
            warmup = min(warmup, int(self.max_warmup_fraction * total))
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if total is None:  # the run's length is unknown yet: hold the peak
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.pop("clock", None)  # the run's own timer and pace, not settings
        state.pop("_first", None)
        if self.derived_total:
            state.pop("total_steps", None)
        return state
