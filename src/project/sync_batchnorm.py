"""`--trainer.sync_batchnorm=true` that keeps timm's fused norm + activation layers whole.

Lightning converts BatchNorm layers with `torch.nn.SyncBatchNorm.convert_sync_batchnorm`, which turns
timm's `BatchNormAct2d` (a BatchNorm2d subclass that also applies its activation, as in EfficientNet,
MobileNet, RegNet) into a plain SyncBatchNorm: the activation is silently dropped, so DDP trains and
validates another network than the one the checkpoint is loaded into. timm's own converter makes a
`SyncBatchNormAct` of it instead; `revert` (after fit) turns that back into a `BatchNormAct2d`.
"""

from __future__ import annotations

import sys

import torch
from lightning.pytorch.plugins import TorchSyncBatchNorm
from torch import nn
from typing_extensions import override


class SyncBatchNorm(TorchSyncBatchNorm):
    """Lightning's TorchSyncBatchNorm, with timm's converter where timm is in use."""

    @override
    def apply(self, model: nn.Module) -> nn.Module:
        if "timm" not in sys.modules:  # no timm layer can be in the model
            return super().apply(model)
        from timm.layers import convert_sync_batchnorm

        return convert_sync_batchnorm(model)  # torch's BatchNorm layers as torch's converter does

    @override
    def revert(self, model: nn.Module) -> nn.Module:
        timm_layers = sys.modules.get("timm.layers")
        if timm_layers is None or not isinstance(model, timm_layers.SyncBatchNormAct):
            return super().revert(model)  # which calls this method for each child
        plain = timm_layers.BatchNormAct2d(
            model.num_features, model.eps, model.momentum, model.affine, model.track_running_stats,
            apply_act=False,
        )  # fmt: skip
        if model.affine:
            with torch.no_grad():
                plain.weight, plain.bias = model.weight, model.bias
        plain.running_mean, plain.running_var = model.running_mean, model.running_var
        plain.num_batches_tracked = model.num_batches_tracked
        plain.train(model.training)
        for name, child in model.named_children():  # its activation and drop layers
            plain.add_module(name, self.revert(child))
        return plain
