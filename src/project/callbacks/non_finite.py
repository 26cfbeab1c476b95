"""Stop (or skip the step) at the first NaN/inf loss or gradient norm, naming the step and likely causes."""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from project.errors import UserError


class NonFiniteError(UserError):
    """Training diverged: the loss or the gradients stopped being finite numbers."""


class NonFiniteGuard(Callback):
    """Checks the loss and the total gradient norm of every optimizer step, before the weights change.

    One device sync per step, after backward (where the loss is usually read for the progress bar
    anyway). Under float16 mixed precision the gradient check is left to the GradScaler, which skips
    steps with inf gradients on purpose while it calibrates its scale; the loss is still checked.
    Skipping also restores the buffers (BatchNorm running statistics) that the bad batch's forward
    pass changed, so a skipped batch leaves no trace in the model.
    """

    def __init__(self, action: Literal["stop", "skip", "off"] = "stop") -> None:
        """
        Args:
            action: stop: end training with an error (the command exits non-zero); skip: drop that
                optimizer step (the weights stay as they were) with a warning; off: no check.
        """
        self.action = action
        self.skipped = 0
        self._loss: torch.Tensor | None = None
        self._buffers: list[torch.Tensor] | None = None

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.action == "skip" and self._buffers is None:  # first micro-batch of the step
            self._buffers = [b.detach().clone() for b in pl_module.buffers()]

    @override
    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        if self.action != "off":
            # accumulated micro-batches: a non-finite one anywhere poisons the step, so keep the worst
            loss = loss.detach().float()
            self._loss = loss if self._loss is None else torch.where(torch.isfinite(loss), self._loss, loss)

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        saved, self._buffers = self._buffers, None  # cleared every step, also one without backward
        if self.action == "off" or self._loss is None:
            return
        loss, self._loss = self._loss, None
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        norm = torch.nn.utils.get_total_norm(grads) if grads and scaler is None else loss.new_zeros(())
        finite = bool(torch.isfinite(torch.stack([loss, norm.to(loss)])).all())
        if trainer.world_size > 1:  # losses differ per rank: all stop or skip together, or they hang
            finite = trainer.strategy.reduce_boolean_decision(finite, all=True)
        if finite:
            return
        what = f"loss is {loss.item()}" if not torch.isfinite(loss) else f"gradient norm is {norm.item()}"
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch})"
        if self.action == "skip":
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None  # optimizers skip parameters without a gradient: the weights stay
            for buffer, value in zip(pl_module.buffers(), saved or [], strict=False):
                buffer.copy_(value)
            self.skipped += 1
            pl_module.log("train/skipped_steps", float(self.skipped), on_step=True, on_epoch=False)
            rank_zero_warn(f"Skipped optimizer step {where}: the {what}.")
            return
        lr = float(optimizer.param_groups[0]["lr"])
        raise NonFiniteError(
            f"Training stopped at {where}: the {what}. Likely causes: a learning rate too high "
            f"(lr={lr:g} now), NaN/inf inputs, no gradient clipping, float16 overflow.",
            "lower --model.optimizer.init_args.lr (or add warm-up), clip with "
            "--trainer.gradient_clip_val=1.0, use --trainer.precision=bf16-mixed instead of 16-mixed, "
            "check the inputs (the data check prints the first batch); "
            "--non_finite.action=skip drops such steps instead.",
        )
