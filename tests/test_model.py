from functools import partial

import pytest
import torch
from torch import nn

from project.model import ImageClassifier
from project.optim import build_optimizer
from project.schedulers import WarmupCosineLR


def one_step(model: ImageClassifier) -> torch.optim.Optimizer:
    optimizer = model.configure_optimizers()["optimizer"]
    model.train()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    loss, _ = model.loss((images, torch.tensor([0, 1, 2, 0])))
    loss.backward()
    optimizer.step()
    return optimizer


def test_frozen_backbone_does_not_change_but_head_does() -> None:
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=3, backbone="resnet18", freeze_backbone=True, scheduler=None)
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    optimizer = one_step(model)
    after = model.net.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"fc.weight", "fc.bias"}  # BatchNorm running stats stay too
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(model.net.fc.weight), id(model.net.fc.bias)}
    assert not model.net.bn1.training and model.training


def test_normalization_is_inside_the_model() -> None:
    model = ImageClassifier(num_classes=2, backbone="resnet18", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    x = model.normalize(torch.tensor([0, 128, 255], dtype=torch.uint8).view(1, 3, 1, 1))
    assert torch.allclose(x.flatten(), torch.tensor([-2.0, (128 / 255 - 0.5) / 0.25, 2.0]), atol=1e-5)


def test_no_weight_decay_on_biases_and_norms() -> None:
    model = ImageClassifier(num_classes=2, backbone="resnet18", scheduler=None)
    decay, no_decay = model.configure_optimizers()["optimizer"].param_groups
    assert all(p.ndim > 1 for p in decay["params"]) and no_decay["weight_decay"] == 0.0
    assert all(p.ndim <= 1 for p in no_decay["params"])


def test_optimizer_runs_fused_unless_the_config_chose_an_implementation() -> None:
    model = ImageClassifier(num_classes=2, backbone="resnet18", scheduler=None)
    fused = model.configure_optimizers()["optimizer"]
    assert fused.defaults["fused"] is True and {g["fused"] for g in fused.param_groups} == {True}
    assert [g["weight_decay"] for g in fused.param_groups][1] == 0.0  # the groups are kept
    groups = [{"params": list(model.parameters())}]
    for chosen in ({"fused": False}, {"foreach": True}):
        optimizer = build_optimizer(partial(torch.optim.AdamW, lr=0.1, **chosen), groups)
        assert optimizer.param_groups[0]["fused"] in (None, False)  # the user's choice stands
    assert isinstance(build_optimizer(partial(torch.optim.RMSprop, lr=0.1), groups), torch.optim.RMSprop)
    only_params = build_optimizer(lambda params: torch.optim.AdamW(params, lr=0.1), groups)
    assert only_params.defaults["fused"] is None
    for odd in (torch.ones(3, dtype=torch.complex64), torch.ones(3, device="meta")):  # no fused kernel
        assert (
            build_optimizer(partial(torch.optim.AdamW), [{"params": [nn.Parameter(odd)]}]).defaults["fused"]
            is None
        )


def test_a_fused_step_is_the_default_step() -> None:
    weights = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = ImageClassifier(num_classes=3, backbone="resnet18", scheduler=None)
        model.optimizer = partial(torch.optim.AdamW, lr=0.01, weight_decay=0.05, fused=fused)
        optimizer = model.configure_optimizers()["optimizer"]
        assert optimizer.defaults["fused"] is fused
        initial = torch.cat([p.detach().flatten() for p in model.parameters()])
        model.train()
        images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
        loss, _ = model.loss((images, torch.tensor([0, 1, 2, 0])))
        loss.backward()
        optimizer.step()  # one step: later ones amplify rounding where Adam divides tiny gradients
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert (weights[0] - weights[1]).abs().max() < 1e-6 and (weights[0] - initial).abs().max() > 1e-3


def test_bn_momentum_override() -> None:
    model = ImageClassifier(num_classes=2, backbone="mobilenet_v3_small", bn_momentum=0.1)
    momenta = {m.momentum for m in model.net.modules() if isinstance(m, nn.BatchNorm2d)}
    assert momenta == {0.1}


@pytest.mark.parametrize("step", [0, 4, 9, 10, 55, 100])
def test_warmup_cosine(step: int) -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = WarmupCosineLR(optimizer, warmup_steps=10, total_steps=100)
    expected = {0: 1 / 11, 4: 5 / 11, 9: 10 / 11, 10: 1.0, 55: 0.5, 100: 0.0}[step]
    assert scheduler.factor(step) == pytest.approx(expected)


def test_plateau_scheduler_watches_val_loss() -> None:
    model = ImageClassifier(
        num_classes=2,
        backbone="resnet18",
        scheduler=lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
    )
    config = model.configure_optimizers()["lr_scheduler"]
    assert config["monitor"] == "val/loss" and config["interval"] == "epoch"


# room: recipes begin
def test_flip_tta_is_the_same_in_validation_and_predict() -> None:
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=3, backbone="resnet18", tta="flip").eval()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 0])
    with torch.no_grad():
        logits = model.validation_step((images, labels), 0)
        probs = model.predict_step((images, labels), 0).softmax(1)  # predict_step returns logits
        views = torch.stack([model(images), model(images.flip(-1))])
        plain = model(images).softmax(1)
    # the mean of the two views' logits: numbers of the same kind as one view's, so the export's
    # temperature (fitted on plain logits) applies to them unchanged
    # and so does its unknown threshold  # room: unknown
    assert torch.allclose(model.predict_step((images, labels), 0), views.mean(0), atol=1e-6)
    assert torch.allclose(probs, views.mean(0).softmax(1), atol=1e-6)
    assert torch.allclose(logits.softmax(1), probs, atol=1e-6)  # what validate scores is what predict says
    assert not torch.allclose(probs, plain, atol=1e-4)


# room: recipes end
def test_a_learnt_tensor_assigned_as_a_plain_attribute_is_named_before_training() -> None:
    from project.errors import UserError
    from project.model import ImageClassifier

    model = ImageClassifier(num_classes=3, backbone="resnet18", channels_last=False)
    model.setup("fit")  # a sound model passes
    model.net.layer1.gain = torch.ones(64, requires_grad=True)  # not registered: no optimizer sees it
    assert "layer1.gain" not in dict(model.named_parameters())
    with pytest.raises(
        UserError, match=r"require grad but are plain attributes, not parameters: net\.layer1\.gain"
    ):
        model.setup("fit")
    model.net.layer1.gain = torch.nn.Parameter(torch.ones(64))  # the fix the message gives
    model.setup("fit")
