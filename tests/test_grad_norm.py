"""Gradient norms: the total and one per top-level module, on the logged steps only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torchvision.models import resnet18

from project.callbacks.grad_norm import top_level_groups
from project.model import ImageClassifier
from tests.helpers import fast_args, run_cli


def test_groups_look_through_the_wrapper() -> None:
    model = ImageClassifier(num_classes=3, backbone="resnet18")
    groups = top_level_groups(model)
    assert list(groups) == ["conv1", "bn1", "layer1", "layer2", "layer3", "layer4", "fc"]
    assert sum(p.numel() for ps in groups.values() for p in ps) == sum(p.numel() for p in model.parameters())
    assert list(top_level_groups(resnet18())) == list(groups)


@pytest.mark.slow
def test_norms_are_logged_every_n_steps_and_add_up(workdir: Path, shapes_root: Path) -> None:
    args = fast_args(shapes_root, "--name=g", "--trainer.max_epochs=2", "--trainer.log_every_n_steps=2")
    assert run_cli("fit", *args) == 0
    events = EventAccumulator(str(workdir / "logs" / "g"))
    events.Reload()
    tags = [t for t in events.Tags()["scalars"] if t.startswith("grad_norm/")]
    assert sorted(tags) == sorted(
        f"grad_norm/{m}" for m in ["conv1", "bn1", *(f"layer{i}" for i in range(1, 5)), "fc", "total"]
    )
    total = events.Scalars("grad_norm/total")
    assert [e.step for e in total] == [1, 3, 5]  # 3 steps per epoch, every 2nd step logged (0-based)
    assert [e.step for e in total] == [e.step for e in events.Scalars("train/loss")]
    parts = torch.tensor([[e.value for e in events.Scalars(t)] for t in tags if t != "grad_norm/total"])
    torch.testing.assert_close(parts.norm(dim=0), torch.tensor([e.value for e in total]), rtol=1e-4, atol=0)
    assert all(e.value > 0 for e in total)
