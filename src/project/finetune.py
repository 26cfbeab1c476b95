"""Fine-tuning pretrained weights: head-only epochs first, then every layer at a depth-decayed learning rate.

fastai's `fine_tune` and timm's `--layer-decay`. The depth levels are the model's own blocks where its
family declares them (`layer_ids`: timm's `group_matcher`, the stem, each block, the head). Elsewhere
(every torchvision backbone), without a table per architecture: the backbone's parameters, in the order
the network defines them (input to output for every torchvision classification model), are cut into
`LEVELS` runs of about equal length. The head learns
at the optimizer's learning rate, the level just below it at lr x decay, the next at lr x decay^2, and
the first layers at lr x decay^(levels - 1).
"""

from __future__ import annotations

from torch import nn

from project.backbones import family_of, head_of

LEVELS = 8


def depth_levels(net: nn.Module, backbone: str) -> list[list[nn.Parameter]]:
    """`net`'s (backbone `backbone`'s) parameters by depth, first layers first, the head's alone in the last
    level."""
    head = {id(p) for p in head_of(net).parameters()}
    ids = family_of(backbone).layer_ids(net)
    if ids is not None:
        last = max(ids.values())
        levels: list[list[nn.Parameter]] = [[] for _ in range(last + 1)]
        for name, param in net.named_parameters():
            if id(param) not in head:
                levels[min(ids.get(name, last), last)].append(param)
        levels = [level for level in levels if level]
    else:
        backbone = [p for p in net.parameters() if id(p) not in head]
        levels = [
            backbone[i * len(backbone) // LEVELS : (i + 1) * len(backbone) // LEVELS] for i in range(LEVELS)
        ]
    return [*levels, [p for p in net.parameters() if id(p) in head]]


def depth_groups(net: nn.Module, backbone: str, layer_decay: float) -> list[dict]:
    """Optimizer parameter groups: per depth level (first layers first, head last), the weights, then the
    biases and norm scales (no weight decay), each with `lr_scale`, its factor on the learning rate."""
    levels = depth_levels(net, backbone)
    groups = []
    for depth, level in enumerate(levels):
        scale = layer_decay ** (len(levels) - 1 - depth)
        groups.append({"params": [p for p in level if p.ndim > 1], "lr_scale": scale})
        groups.append({"params": [p for p in level if p.ndim <= 1], "lr_scale": scale, "weight_decay": 0.0})
    return groups
