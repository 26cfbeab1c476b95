"""`python -m project memory`: the budget of one training step, measured, with advice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from project.memory_budget import ActivationCounter, MemoryBudget, advice
from project.model import ImageClassifier
from tests.helpers import MiB, budget_of, fast_args, run_cli


def run_memory(shapes_root: Path, capsys, *extra: str) -> tuple[dict[str, float], str]:
    assert run_cli("memory", *fast_args(shapes_root, *extra)) == 0
    out = capsys.readouterr().out
    return budget_of(out), out


def test_budget_is_measured_and_scales_with_the_batch(workdir: Path, shapes_root: Path, capsys) -> None:
    small, out = run_memory(shapes_root, capsys, "--data.batch_size=8")
    large, _ = run_memory(shapes_root, capsys, "--data.batch_size=16")
    params = sum(p.numel() for p in ImageClassifier(num_classes=6, backbone="resnet18").parameters())
    assert f"{params / 1e6:.2f} M parameters" in out
    assert small["gradients"] == pytest.approx(params * 4 / MiB, abs=0.1)
    assert small["optimizer state (AdamW)"] == pytest.approx(
        2 * params * 4 / MiB, abs=0.1
    )  # exp_avg, exp_avg_sq
    assert large["activations"] == pytest.approx(2 * small["activations"], rel=0.05)  # linear in the batch
    assert large["parameters + buffers"] == small["parameters + buffers"]
    assert "batch 4 with --trainer.accumulate_grad_batches=2" in out
    assert "--model.freeze_backbone=true" in out and "gradient checkpointing" in out
    assert not (workdir / "logs").exists() and not (workdir / "checkpoints").exists()  # no run is made


def test_activation_counter_counts_each_storage_once() -> None:
    layer = nn.Linear(100, 100)
    counter = ActivationCounter(list(layer.parameters()))
    x = torch.ones(10, 100, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
        layer(x).relu().sum()
    assert counter.bytes == 2 * 10 * 100 * 4  # the input of the matmul and the relu's output, not the weight


def test_advice_when_it_does_not_fit() -> None:
    budget = MemoryBudget(
        device=torch.device("cpu"),
        batch_shape=(64, 3, 224, 224),
        precision="32-true",
        parameters=100 * MiB,
        parameter_count=25_000_000,
        gradients=100 * MiB,
        optimizer_state=200 * MiB,
        optimizer="AdamW",
        activations=6000 * MiB,
        inputs=10 * MiB,
        head_parameters=8 * MiB,
        device_memory=4096 * MiB,
        peak=None,
    )
    lines = "\n".join(advice(budget, accumulate=1))
    assert lines.startswith("Does not fit in 90% of the device's memory")
    assert "batch 32 with --trainer.accumulate_grad_batches=2" in lines
    assert "--trainer.precision=bf16-mixed: activations about halve (~3000 MiB)" in lines
    assert "gradients + optimizer state 300.0 -> 24.0 MiB (head only)" in lines
