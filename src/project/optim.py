"""The optimizer as the model builds it: its fused kernel where one exists, its state in its parameters'
layout."""

from __future__ import annotations

import torch
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from project.errors import UserError

# where torch's fused optimizer kernels run (torch checks it only at the first step)
FUSED_DEVICES = ("cpu", "cuda", "xpu")


def build_optimizer(
    make: OptimizerCallable, groups: list[dict], clips_mixed: bool = False
) -> torch.optim.Optimizer:
    """`make(groups)`, with the optimizer's fused kernel when it has one and no implementation was
    chosen (`fused` and `foreach` left unset in the config); with `clips_mixed` (gradient clipping under
    16-mixed/bf16-mixed) the foreach kernel instead: Lightning cannot clip a fused optimizer's gradients
    there, as the fused step unscales them itself.

    torch picks the fused kernels by itself only on CUDA; on the CPU an unset AdamW runs a dozen tensor
    operations per parameter, each from Python: for resnet18 a step takes 20-40 ms against 6-7 ms
    fused (`bench/optimizer_step.py`), as much as a 32 px batch's backward pass. The fused kernels
    (Adam, AdamW, SGD, Adagrad) do the same arithmetic in one pass. Parameters that are not plain
    tensors (FSDP's flat parameters, DTensors) and devices without the kernels keep the default.
    """
    optimizer = make([dict(group) for group in groups])
    chosen = (
        optimizer.defaults.get("fused", False) is not None or optimizer.defaults.get("foreach") is not None
    )
    params = [p for group in optimizer.param_groups for p in group["params"]]
    covered = all(
        type(p) is nn.Parameter and p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params
    )
    if clips_mixed and optimizer.defaults.get("fused"):
        raise UserError(
            f"{type(optimizer).__name__}(fused=True) cannot have its gradients clipped under mixed "
            "precision: the fused step unscales them itself (--trainer.gradient_clip_val).",
            "leave out --model.optimizer.init_args.fused (the template then runs the foreach kernel), "
            "or set --trainer.gradient_clip_val=0.",
        )
    if chosen or optimizer.defaults.get("differentiable") or not covered:
        return optimizer
    kernel = {"foreach": True} if clips_mixed else {"fused": True}
    try:
        chosen_kernel = make([dict(group) for group in groups], **kernel)
    except TypeError:  # a callable that takes only the parameters (a lambda from Python code)
        return optimizer
    if clips_mixed:
        rank_zero_info(
            f"{type(optimizer).__name__} runs its foreach kernel, not the fused one: Lightning clips "
            "gradients under mixed precision only for an optimizer that does not unscale them itself."
        )
    return chosen_kernel


def match_state_layout(optimizer: torch.optim.Optimizer) -> None:
    """Give each optimizer state tensor its parameter's strides. A checkpoint keeps the memory format it
    was written in (a contiguous run resumed channels-last, a CPU run resumed on a GPU, or the reverse),
    and the fused AdamW step reads a state tensor in its parameter's layout: with other strides it
    updates the wrong elements, silently (the foreach step copes)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if torch.is_tensor(value) and value.shape == param.shape and value.stride() != param.stride():
                    state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)
