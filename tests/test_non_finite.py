"""The non-finite guard: a diverging run stops with the step and the causes, or the bad step is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from project.callbacks import NonFiniteGuard
from project.callbacks.non_finite import NonFiniteError
from project.model import ImageClassifier
from tests.helpers import TensorData, fast_args, run_cli, tiny_trainer

pytestmark = pytest.mark.slow  # every test here trains or starts a server


def poisoned_data() -> TensorData:
    """Four batches of 8 float images; batch 2 (the third) holds one NaN pixel."""
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(32, 3, 16, 16, generator=generator) * 255
    images[17, 0, 3, 3] = float("nan")
    return TensorData(images, torch.arange(32) % 4)


def test_huge_learning_rate_stops_the_command(workdir: Path, shapes_root: Path, capsys) -> None:
    code = run_cli(
        "fit",
        *fast_args(
            shapes_root,
            "--model.optimizer=torch.optim.SGD",
            "--model.optimizer.init_args.lr=1e30",
            "--model.scheduler=null",
        ),
    )
    assert code != 0
    err = capsys.readouterr().err
    assert "error: Training stopped at step 1 (epoch 0): the loss is nan." in err
    assert "learning rate too high (lr=1e+30 now)" in err
    assert "--trainer.gradient_clip_val=1.0" in err and "--non_finite.action=skip" in err


def test_nan_batch_stops_at_its_step() -> None:
    model = ImageClassifier(num_classes=4, backbone="resnet18", scheduler=None)
    with pytest.raises(NonFiniteError, match=r"at step 2 \(epoch 0\): the loss is nan"):
        tiny_trainer(NonFiniteGuard(), limit_val_batches=0).fit(model, poisoned_data())


def test_skip_drops_the_step_and_leaves_no_trace() -> None:
    torch.manual_seed(0)
    model = ImageClassifier(num_classes=4, backbone="resnet18", scheduler=None)
    guard = NonFiniteGuard(action="skip")
    with pytest.warns(UserWarning, match=r"Skipped optimizer step step 2 \(epoch 0\): the loss is nan"):
        tiny_trainer(guard, limit_val_batches=0).fit(model, poisoned_data())
    assert guard.skipped == 1
    assert all(torch.isfinite(t).all() for t in model.net.state_dict().values())  # BatchNorm statistics too
    # the skipped step changed nothing: the same run on the three good batches gives the same weights
    torch.manual_seed(0)
    clean = ImageClassifier(num_classes=4, backbone="resnet18", scheduler=None)
    data = poisoned_data()
    keep = [i for i in range(32) if i // 8 != 2]
    data.data = torch.utils.data.TensorDataset(*(t[keep] for t in data.data.tensors))
    tiny_trainer(limit_val_batches=0).fit(clean, data)
    for (name, a), b in zip(model.net.state_dict().items(), clean.net.state_dict().values(), strict=True):
        if name.endswith("num_batches_tracked"):
            continue
        torch.testing.assert_close(a, b, msg=name)
