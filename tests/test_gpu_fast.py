"""configs/presets/gpu_fast.yaml: what it turns on, that a compiled run checkpoints and exports cleanly,
and that channels-last + torch.compile compute what eager does."""

from __future__ import annotations

import copy
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
from project.optim import match_state_layout
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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backbone", "flag", "expected"),
    [
        ("mobilenet_v3_small", "auto", True),
        ("resnet18", "auto", False),
        ("mobilenet_v3_small", "false", False),
    ],
)
def test_channels_last_auto_in_a_cpu_fit_follows_grouped_convolutions(
    workdir: Path, shapes_root: Path, backbone: str, flag: str, expected: bool
) -> None:
    """auto: a CPU fit runs a network with depthwise convolutions channels-last (the checkpoint keeps the
    layout of the tensors it was given), a resnet contiguous, and false turns it off; the hyper-parameter
    stays as given, so a model rebuilt from the checkpoint (predict, export) is contiguous."""
    args = fast_args(shapes_root, "--name=m", f"--model.backbone={backbone}", f"--model.channels_last={flag}")
    assert run_cli("fit", *args) == 0
    checkpoint = torch.load(workdir / "checkpoints" / "m" / "last.ckpt", weights_only=False)
    first_conv = next(v for k, v in checkpoint["state_dict"].items() if v.ndim == 4 and v.shape[-1] > 1)
    assert first_conv.is_contiguous(memory_format=torch.channels_last) is expected
    assert first_conv.is_contiguous() is not expected
    assert checkpoint["hyper_parameters"]["channels_last"] == {"auto": "auto", "false": False}[flag]
    rebuilt = ImageClassifier.load_from_checkpoint(workdir / "checkpoints" / "m" / "last.ckpt")
    assert not rebuilt.channels_last and next(rebuilt.net.parameters()).is_contiguous()


def test_a_loaded_optimizer_state_takes_its_parameters_layout_so_the_fused_step_is_right() -> None:
    """A contiguous run's AdamW state loaded for channels-last parameters: the fused step read it in the
    wrong order (0.16 off after one step here) until match_state_layout gave it the parameters' strides."""
    torch.manual_seed(0)
    contiguous = nn.Parameter(torch.randn(8, 4, 3, 3))
    last = nn.Parameter(contiguous.detach().clone().contiguous(memory_format=torch.channels_last))
    reference = torch.optim.AdamW([contiguous], lr=0.1, fused=True)
    resumed = torch.optim.AdamW([last], lr=0.1, fused=True)
    contiguous.grad = torch.randn(8, 4, 3, 3)
    reference.step()
    resumed.load_state_dict(copy.deepcopy(reference.state_dict()))  # as a resume loads a checkpoint
    with torch.no_grad():
        last.copy_(contiguous)
    match_state_layout(resumed)
    assert resumed.state[last]["exp_avg"].is_contiguous(memory_format=torch.channels_last)
    gradient = torch.randn(8, 4, 3, 3)
    contiguous.grad, last.grad = gradient, gradient.contiguous(memory_format=torch.channels_last)
    reference.step()
    resumed.step()
    torch.testing.assert_close(last.detach(), contiguous.detach())


@pytest.mark.slow
def test_a_contiguous_checkpoint_resumed_in_a_channels_last_fit_continues_in_that_layout(
    workdir: Path, shapes_root: Path
) -> None:
    args = fast_args(shapes_root, "--name=r", "--model.backbone=mobilenet_v3_small")
    assert run_cli("fit", *args, "--model.channels_last=false") == 0
    run = workdir / "checkpoints" / "r"
    resume = ["--trainer.max_epochs=2", f"--ckpt_path={run / 'last.ckpt'}"]
    # the checkpoint's own settings are a config layer on resume: the flag changes the layout
    assert run_cli("fit", *args, *resume, "--model.channels_last=auto") == 0
    checkpoint = torch.load(run / "last.ckpt", weights_only=False)
    assert checkpoint["epoch"] == 1
    weights = [v for v in checkpoint["state_dict"].values() if v.ndim == 4 and v.shape[-1] > 1]
    states = [
        s["exp_avg"] for s in checkpoint["optimizer_states"][0]["state"].values() if s["exp_avg"].ndim == 4
    ]
    assert weights and all(w.is_contiguous(memory_format=torch.channels_last) for w in weights)
    # every 4-d state in the layout of the (channels-last) parameters, not the layout it was loaded in
    assert states and all(
        s.is_contiguous(memory_format=torch.channels_last) for s in states if s.shape[-1] > 1
    )
