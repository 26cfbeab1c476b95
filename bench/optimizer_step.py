"""Optimizer step time: AdamW as torch picks it against the template's `build_optimizer` (fused).

    python bench/optimizer_step.py [--steps 30] [--rounds 3]

For each network, the template's two parameter groups (decay / no decay on biases and norms) with
random gradients, then `optimizer.step()` timed: AdamW with `fused` and `foreach` unset (what a
hand-written loop gets: on the CPU, one tensor operation at a time per parameter from Python)
against `project.optim.build_optimizer` (the fused kernel). The two alternate `--rounds` times in
this process; each figure is the median step over `--steps` steps after 3 warm-up steps.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import torch
import torchvision

from project.optim import build_optimizer

NETWORKS = ("resnet18", "mobilenet_v3_small", "shufflenet_v2_x0_5")


def groups(net: torch.nn.Module) -> list[dict]:
    params = list(net.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    decay = [p for p in params if p.ndim > 1]
    return [{"params": decay}, {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]


def median_step(optimizer: torch.optim.Optimizer, steps: int) -> float:
    for _ in range(3):
        optimizer.step()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    make = partial(torch.optim.AdamW, lr=0.002, weight_decay=0.05)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| network | parameters | AdamW as torch picks, ms | fused (template), ms | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for name in NETWORKS:
        net = torchvision.models.get_model(name, num_classes=10)
        param_groups = groups(net)
        plain, fused = [], []
        for _ in range(args.rounds):
            plain.append(median_step(make([dict(g) for g in param_groups]), args.steps))
            optimizer = build_optimizer(make, param_groups)
            assert optimizer.defaults["fused"] is True
            fused.append(median_step(optimizer, args.steps))
        a, b = statistics.median(plain) * 1e3, statistics.median(fused) * 1e3
        count = sum(len(g["params"]) for g in param_groups)
        print(f"| {name} | {count} tensors | {a:.1f} | {b:.1f} | **{a / b:.2f}x** |")


if __name__ == "__main__":
    main()
