"""Fine-tuning schedule: head-only epochs, then every layer at depth-decayed learning rates."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from project.backbones import build_backbone, head_of
from project.finetune import LEVELS, depth_groups
from project.model import ImageClassifier
from tests.helpers import TensorData, tiny_trainer

LR = 0.01


@pytest.mark.parametrize("backbone", ["resnet18", "mobilenet_v3_small", "squeezenet1_0"])
def test_depth_groups_cover_every_parameter_once_head_last(backbone: str) -> None:
    net = build_backbone(backbone, 3)
    groups = depth_groups(net, backbone, 0.5)
    grouped = [id(p) for g in groups for p in g["params"]]
    assert sorted(grouped) == sorted(id(p) for p in net.parameters())
    assert [g["lr_scale"] for g in groups[::2]] == [0.5 ** (LEVELS - k) for k in range(LEVELS + 1)]
    head = {id(p) for p in head_of(net).parameters()}
    assert {id(p) for g in groups[-2:] for p in g["params"]} == head
    assert all(p.ndim <= 1 for g in groups[1::2] for p in g["params"]) and groups[1]["weight_decay"] == 0.0
    first = next(net.parameters())  # the first layer learns slowest
    assert any(p is first for p in groups[0]["params"])


class Phases(L.Callback):
    """What the backbone looks like in each epoch's first training step, and the optimizer's rates."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[bool, bool, list[float]]] = {}

    def on_train_batch_start(self, trainer: L.Trainer, module: ImageClassifier, *args: object) -> None:
        lrs = [g["lr"] for g in trainer.optimizers[0].param_groups]
        trainable = module.net.conv1.weight.requires_grad
        self.seen.setdefault(trainer.current_epoch, (trainable, module.net.bn1.training, lrs))


def model() -> ImageClassifier:
    optimizer = lambda params: torch.optim.AdamW(params, lr=LR)  # noqa: E731
    return ImageClassifier(
        num_classes=3,
        backbone="resnet18",
        head_epochs=1,
        layer_decay=0.5,
        scheduler=None,
        optimizer=optimizer,
    )


def data() -> TensorData:
    g = torch.Generator().manual_seed(0)
    return TensorData(
        torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8, generator=g), torch.arange(16) % 3
    )


@pytest.mark.slow
def test_head_epochs_then_every_layer_with_decayed_rates(tmp_path: Path) -> None:
    torch.manual_seed(0)
    classifier, phases = model(), Phases()
    stem = classifier.net.conv1.weight.detach().clone()
    running = classifier.net.bn1.running_mean.clone()
    trainer = tiny_trainer(phases, max_epochs=1, limit_val_batches=0, limit_train_batches=1)
    trainer.fit(classifier, data())
    assert torch.equal(classifier.net.conv1.weight, stem)  # frozen: no step, no weight decay
    assert torch.equal(classifier.net.bn1.running_mean, running)  # BatchNorm in eval mode
    trainer.save_checkpoint(tmp_path / "head.ckpt")

    # resumed after the head-only epoch: the next epoch trains every layer, with the same groups
    resumed, phases = model(), Phases()
    resume = tiny_trainer(phases, max_epochs=2, limit_val_batches=0, limit_train_batches=1)
    resume.fit(resumed, data(), ckpt_path=tmp_path / "head.ckpt")
    trainable, bn_training, lrs = phases.seen[1]
    assert trainable and bn_training
    assert lrs == pytest.approx([LR * 0.5 ** (LEVELS - k) for k in range(LEVELS + 1) for _ in (0, 1)])
    assert not torch.equal(resumed.net.conv1.weight, stem)


@pytest.mark.slow
def test_first_epoch_is_head_only() -> None:
    torch.manual_seed(0)
    phases = Phases()
    tiny_trainer(phases, max_epochs=2, limit_val_batches=0, limit_train_batches=1).fit(model(), data())
    assert [phases.seen[e][:2] for e in (0, 1)] == [(False, False), (True, True)]


def test_options_are_checked() -> None:
    from project.errors import UserError

    with pytest.raises(UserError, match=r"model\.layer_decay"):
        ImageClassifier(num_classes=3, backbone="resnet18", layer_decay=0.0)
    assert isinstance(head_of(build_backbone("resnet18", 3)), nn.Linear)
