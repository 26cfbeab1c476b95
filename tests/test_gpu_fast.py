"""configs/presets/gpu_fast.yaml: what it turns on, that a compiled run checkpoints and exports cleanly,
and that channels-last + torch.compile compute what eager does."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from torch import nn

from project.data.datamodule import ImageDataModule
from project.errors import UserError
from project.model import ImageClassifier
from project.trainer import Trainer
from tests.helpers import fast_args, run_cli

GPU_FAST = Path(__file__).resolve().parents[1] / "configs" / "presets" / "gpu_fast.yaml"


@pytest.fixture(autouse=True)
def keep_cudnn_benchmark() -> Iterator[None]:
    """The Trainer sets torch.backends.cudnn.benchmark for the whole process: put it back."""
    before = torch.backends.cudnn.benchmark
    yield
    torch.backends.cudnn.benchmark = before


def parse(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[L.Trainer, ImageClassifier, ImageDataModule]:
    """Run `fit --config gpu_fast.yaml ARGS` through the real CLI up to, not into, Trainer.fit."""
    built = {}

    @functools.wraps(Trainer.fit)  # the CLI reads fit's signature for its flags
    def capture(trainer: L.Trainer, model: ImageClassifier, datamodule: ImageDataModule, **_: object) -> None:
        built.update(trainer=trainer, model=model, datamodule=datamodule)

    monkeypatch.setattr(Trainer, "fit", capture)
    assert run_cli("fit", "--config", str(GPU_FAST), *args) == 0
    return built["trainer"], built["model"], built["datamodule"]


def train_loader(datamodule: ImageDataModule, accelerator: object) -> torch.utils.data.DataLoader:
    """The training DataLoader the data module builds for a trainer on `accelerator`."""
    datamodule.trainer = SimpleNamespace(
        accelerator=accelerator,
        lightning_module=None,
        world_size=1,
        num_devices=1,
        is_global_zero=True,
        strategy=SimpleNamespace(broadcast=lambda value, src=0: value),
    )
    datamodule.setup("fit")
    return datamodule.train_dataloader()


def test_fragment_over_the_defaults(
    workdir: Path, shapes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, model, datamodule = parse(monkeypatch, *fast_args(shapes_root, "--data.num_workers=2"))
    assert trainer.precision == "bf16-mixed"
    assert torch.backends.cudnn.benchmark is True
    assert model.channels_last and model.compile_net and model.hparams.compile
    assert datamodule.prefetch_factor == 4
    assert model.hparams.backbone == "resnet18"  # later flags still override
    on_cpu = train_loader(datamodule, CPUAccelerator())
    assert not on_cpu.pin_memory and on_cpu.persistent_workers and on_cpu.prefetch_factor == 4
    on_gpu = train_loader(datamodule, CUDAAccelerator())
    assert on_gpu.pin_memory and on_gpu.persistent_workers and on_gpu.prefetch_factor == 4


def test_prefetch_factor_needs_workers_and_a_positive_value(shapes_root: Path) -> None:
    in_process = ImageDataModule(root=str(shapes_root), num_workers=0, prefetch_factor=4)
    assert train_loader(in_process, CPUAccelerator()).prefetch_factor is None  # nothing to prefetch with
    with pytest.raises(UserError, match=r"--data.prefetch_factor=0 is out of range: it must be an integer"):
        ImageDataModule(root=str(shapes_root), prefetch_factor=0)


@pytest.mark.slow
def test_compiled_fit_keeps_plain_checkpoint_keys_and_exports(
    workdir: Path, shapes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole fragment on CPU. Compiling a resnet's training step here takes about a minute (2 cores),
    so the compiled wrapper runs its code eagerly (force_eager): the checkpoint and the export see the
    module exactly as compile leaves it; the compiled numbers are the next test's concern."""
    compiled: list[nn.Module] = []
    original = nn.Module.compile

    def recording(self: nn.Module, *args: object, **kwargs: object) -> None:
        compiled.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "compile", recording)
    args = fast_args(shapes_root, "--name=c", "--export_best.enabled=true")
    with torch.compiler.set_stance("force_eager"):
        assert run_cli("fit", "--config", str(GPU_FAST), *args) == 0
    # the real CLI path applied compile in place, to the network only
    assert [type(m).__name__ for m in compiled] == ["ResNet"] and compiled[0]._compiled_call_impl
    run = workdir / "checkpoints" / "c"
    checkpoint = torch.load(run / "last.ckpt", weights_only=False)
    assert checkpoint["hyper_parameters"]["compile"] is True
    assert not [key for key in checkpoint["state_dict"] if "_orig_mod" in key]
    plain = ImageClassifier(num_classes=6, backbone="resnet18", scheduler=None)
    plain.load_state_dict(checkpoint["state_dict"])  # strict: same keys as a never-compiled model
    assert (run / "latest.onnx").is_file() and (run / "latest.pt2").is_file()


@pytest.mark.slow  # inductor compiles resnet18: about 20 s
@pytest.mark.skipif(
    not any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++")),
    reason="torch.compile on CPU (inductor) needs a C++ compiler; none found",
)
def test_channels_last_compiled_logits_match_eager() -> None:
    torch.manual_seed(0)
    eager = ImageClassifier(num_classes=6, backbone="resnet18", scheduler=None).eval()
    fast = ImageClassifier(
        num_classes=6, backbone="resnet18", scheduler=None, channels_last=True, compile=True
    )
    fast.load_state_dict(eager.state_dict())
    fast.eval().configure_model()  # what Lightning calls before fit, validate, test and predict
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        expected, got = eager(images), fast(images)
    assert expected.abs().max() > 0.1  # not a degenerate comparison of zeros
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_two_step_fit_with_the_fragment_on_gpu(workdir: Path, shapes_root: Path) -> None:
    flags = (
        "--name=g",
        "--trainer.accelerator=gpu",
        "--trainer.limit_train_batches=2",
        "--data.num_workers=2",
        "--data.batch_size=8",  # 24 validation images: equal batches, no recompile for a last smaller one
    )
    assert run_cli("fit", "--config", str(GPU_FAST), *fast_args(shapes_root, *flags)) == 0
    checkpoint = torch.load(
        workdir / "checkpoints" / "g" / "last.ckpt", map_location="cpu", weights_only=False
    )
    assert checkpoint["global_step"] == 2
    assert not [key for key in checkpoint["state_dict"] if "_orig_mod" in key]
    assert all(v.isfinite().all() for v in checkpoint["state_dict"].values() if v.is_floating_point())
