"""Learning-rate schedules that torch does not ship as one class."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


class WarmupCosineLR(LambdaLR):
    """Linear warm-up from 0 over `warmup_steps`, then cosine decay to `min_lr_ratio` x lr at `total_steps`.

    Stepped once per optimizer step. `total_steps=None` means the whole run: the model fills it in
    from `trainer.estimated_stepping_batches`, so max_epochs, accumulation and devices are all counted.
    Such a derived length is left out of checkpoints, so a resumed run with more epochs stretches the
    schedule instead of sitting at its end.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int = 0,
        total_steps: int | None = None,
        min_lr_ratio: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.derived_total = total_steps is None
        self.min_lr_ratio = min_lr_ratio
        super().__init__(optimizer, self.factor, last_epoch)

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        total = self.total_steps if self.total_steps is not None else step + 1
        progress = min(1.0, (step - self.warmup_steps) / max(1, total - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.derived_total:
            state.pop("total_steps", None)
        return state
