"""Log the total gradient norm, and the norm per top-level module, every `log_every_n_steps`."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class GradNormMonitor(Callback):
    """`grad_norm/total` and `grad_norm/<module>` (e.g. `grad_norm/features`, `grad_norm/classifier`).

    Measured before clipping, so a clipped run shows how hard the clip works. Computed only on the
    steps that are logged: the other steps pay nothing.
    """

    def __init__(self, enabled: bool = True, norm_type: float = 2.0) -> None:
        """
        Args:
            enabled: Log gradient norms (`--grad_norm.enabled=false` turns it off).
            norm_type: The p of the p-norm (2.0: Euclidean; inf: largest absolute value).
        """
        self.enabled = enabled
        self.norm_type = norm_type
        self._groups: dict[str, list[torch.nn.Parameter]] = {}

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._groups = top_level_groups(pl_module)

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # the same rule Lightning uses to decide that this step's values reach the logger
        if not self.enabled or (trainer.global_step + 1) % trainer.log_every_n_steps != 0:
            return
        norms = {}
        for name, params in self._groups.items():
            grads = [p.grad for p in params if p.grad is not None]
            if grads:
                norms[f"grad_norm/{name}"] = torch.nn.utils.get_total_norm(grads, self.norm_type)
        if norms:
            total = torch.linalg.vector_norm(torch.stack(list(norms.values())), self.norm_type)
            norms["grad_norm/total"] = total
            pl_module.log_dict(norms, on_step=True, on_epoch=False)


def top_level_groups(module: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    """Trainable parameters by top-level module, looking through wrappers that hold everything.

    `net.features.0.weight` and `net.classifier.3.bias` give the groups `features` and `classifier`.
    """
    named = [(name.split("."), p) for name, p in module.named_parameters() if p.requires_grad]
    while len({parts[0] for parts, _ in named}) == 1 and all(len(parts) > 2 for parts, _ in named):
        named = [(parts[1:], p) for parts, p in named]
    groups: dict[str, list[torch.nn.Parameter]] = {}
    for parts, p in named:
        groups.setdefault(parts[0], []).append(p)
    return groups
