"""Clipping, accumulation and mixed precision take effect in a real fit, also together."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from typing_extensions import override

from project.data.datamodule import ImageDataModule
from project.model import ImageClassifier
from tests.helpers import fast_args, run_cli, tiny_trainer


@pytest.mark.slow
def test_bf16_mixed_with_clipping_fits_with_the_foreach_kernel(
    workdir: Path, shapes_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/troubleshooting.md's advice: the fused AdamW would make Lightning refuse to clip."""
    args = fast_args(shapes_root, "--trainer.precision=bf16-mixed", "--trainer.gradient_clip_val=0.5")
    with caplog.at_level(logging.INFO):
        assert run_cli("fit", *args) == 0
    assert "AdamW runs its foreach kernel, not the fused one" in caplog.text
    assert sorted(p.name for p in (workdir / "checkpoints").rglob("*.ckpt") if p.name != "last.ckpt")


def test_a_fused_optimizer_chosen_with_clipping_under_mixed_precision_is_one_error(
    workdir: Path, shapes_root: Path, capsys
) -> None:
    args = fast_args(
        shapes_root,
        "--trainer.precision=bf16-mixed",
        "--trainer.gradient_clip_val=0.5",
        "--model.optimizer.init_args.fused=true",
    )
    assert run_cli("fit", *args) == 2
    err = capsys.readouterr().err
    assert "error: AdamW(fused=True) cannot have its gradients clipped under mixed precision" in err
    assert "Fix: leave out --model.optimizer.init_args.fused" in err and "Traceback" not in err


class StepRecorder(L.Callback):
    """Per optimizer step: the gradient norm before clipping (Lightning's hook) and after it (the
    optimizer's own step hook, which runs once per real step), and the dtype the head computes in."""

    def __init__(self) -> None:
        self.before: list[float] = []
        self.after: list[float] = []
        self.head_dtypes: set[torch.dtype] = set()

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.optimizers[0].register_step_post_hook(lambda *_: self.after.append(grad_norm(pl_module)))
        pl_module.net.fc.register_forward_hook(lambda m, i, out: self.head_dtypes.add(out.dtype))

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self.before.append(grad_norm(pl_module))


def grad_norm(model: torch.nn.Module) -> float:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).norm().item()


@pytest.mark.slow
@pytest.mark.parametrize(("precision", "dtype"), [("32-true", torch.float32), ("bf16-mixed", torch.bfloat16)])
def test_clipping_accumulation_and_precision_take_effect(
    shapes_root: Path, tmp_path: Path, precision: str, dtype: torch.dtype
) -> None:
    """48 images in batches of 8, accumulated by 3: 2 optimizer steps, each with its gradient norm cut
    to the clip value; the head computes in the precision's dtype."""
    torch.manual_seed(0)
    data = ImageDataModule(root=str(shapes_root), image_size=32, batch_size=8, num_workers=0)
    model = ImageClassifier(num_classes=6, image_size=32, backbone="resnet18", scheduler=None)
    recorder = StepRecorder()
    clip = 0.05
    trainer = tiny_trainer(
        recorder,
        precision=precision,
        gradient_clip_val=clip,
        accumulate_grad_batches=3,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=data)
    assert trainer.global_step == 2 and len(recorder.after) == 2  # 6 batches / 3
    assert min(recorder.before) > 10 * clip  # the clip had work to do
    assert all(norm <= clip * (1 + 1e-3) for norm in recorder.after), recorder.after
    assert all(norm >= clip * (1 - 1e-3) for norm in recorder.after)  # scaled to it, not zeroed
    assert recorder.head_dtypes == {dtype}
