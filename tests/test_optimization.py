"""Clipping, accumulation and mixed precision take effect in a real fit, also together."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.helpers import fast_args, run_cli


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
