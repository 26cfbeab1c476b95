"""An exponential moving average (EMA) of the weights: what validation, checkpoints and exports see."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch.optim.swa_utils import AveragedModel
from typing_extensions import override

from project.config_checks import require


def ema_update(decay: float, warmup: bool) -> Callable:
    """An AveragedModel `multi_avg_fn`: ema = d * ema + (1 - d) * weights, in place, one foreach call per
    device and dtype (torch's get_ema_multi_avg_fn, with timm's and TensorFlow's warm-up of the decay:
    d = min(decay, (1 + n) / (10 + n)) after n updates, so a short run is not averaged with its start)."""

    @torch.no_grad()
    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], updates: torch.Tensor) -> None:
        n = float(updates)
        d = min(decay, (1 + n) / (10 + n)) if warmup else decay
        if torch.is_floating_point(averaged[0]) or torch.is_complex(averaged[0]):
            torch._foreach_lerp_(averaged, current, 1 - d)
        else:  # integer buffers (BatchNorm's num_batches_tracked): the current count
            for a, c in zip(averaged, current, strict=True):
                a.copy_(c)

    return update


class EMA(WeightAveraging):
    """Lightning's WeightAveraging with an EMA of the weights, updated after every optimizer step; off
    unless `decay` is given (`--ema.decay=0.999`).

    Validation runs on the averaged weights (so checkpoint selection and `val/acc` judge them), checkpoints
    hold them as their `state_dict` (the training weights go to `current_model_state`, and a resumed run
    continues both), and so `validate`, `test`, `predict` and the end-of-fit export use them. BatchNorm
    running statistics are averaged like the weights (`use_buffers`), so that they fit the averaged weights.
    """

    def __init__(self, decay: float | None = None, warmup: bool = True, device: str | None = None) -> None:
        """
        Args:
            decay: The weight of the average at each step (0.999: the last ~1,000 steps count; 0.9999 for
                runs of 100,000 steps and more); None: no averaging.
            warmup: Ramp the decay up as min(decay, (1 + n) / (10 + n)) over the first updates n, so that
                the average leaves the random initialization behind in a short run.
            device: Keep the average on this device (e.g. cpu, to spare GPU memory); None: the model's.
        """
        if decay is not None:
            require(0 < decay < 1, "ema.decay", decay, "a number between 0 and 1 (exclusive), e.g. 0.999")
        super().__init__(device=device, use_buffers=True, multi_avg_fn=ema_update(decay or 0.0, warmup))
        self.decay = decay

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # WeightAveraging.setup would also call configure_model (and warn about sharding), which compiles the
        # network in place when --model.compile is set: the copy below has the same layers without it
        if self.decay is not None and stage == "fit":
            device = self._device or pl_module.device
            self._average_model = AveragedModel(pl_module, device, use_buffers=True, **self._kwargs)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._average_model = None  # a later stage in this process (validate, test) does not average

    @override
    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if self._average_model is not None:
            super().on_train_batch_end(trainer, *args, **kwargs)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is not None:
            super().on_train_epoch_end(trainer, pl_module)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._average_model is not None:
            super().on_train_end(trainer, pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() if self.decay is not None else {}

    @override
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._average_model is None:
            return
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        # what is neither a weight nor a buffer (the best val/acc so far, a metric's state) is the run's,
        # not the copy's: the copy was made when fit began and never sees validation
        averaged = {name for name, _ in pl_module.named_parameters()}
        averaged |= {name for name, _ in pl_module.named_buffers()}
        for name, value in checkpoint["current_model_state"].items():
            if name not in averaged:
                checkpoint["state_dict"][name] = value

    @override
    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._average_model is not None:  # outside fit the checkpoint's state_dict is already the average
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
