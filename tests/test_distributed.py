"""Several processes for real: 2-process DDP on CPU (gloo), two simulated nodes, and back to one CPU."""

from __future__ import annotations

import csv
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import DDP, fast_args, run_cli, run_module

ROOT = Path(__file__).resolve().parents[1]


def metrics(stdout: str) -> dict[str, float]:
    """The metrics table Lightning prints after validate/test."""
    return {k: float(v) for k, v in re.findall(r"^\s+((?:val|test)/\S+)\s+([-\d.e]+)\s*$", stdout, re.M)}


@pytest.fixture(scope="module")
def odd_root(tmp_path_factory: pytest.TempPathFactory, shapes_root: Path) -> Path:
    """The tiny shapes with 23 validation images: 2 ranks cannot split them evenly."""
    root = tmp_path_factory.mktemp("odd") / "shapes"
    shutil.copytree(shapes_root, root)
    next((root / "val" / "star").iterdir()).unlink()
    return root


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory, odd_root: Path) -> Path:
    """A 2-process DDP fit on CPU; returns the folder it ran in."""
    work = tmp_path_factory.mktemp("ddp")
    result = run_module(work, "fit", *DDP, *fast_args(odd_root, "--name=ddp", "--trainer.devices=2"))
    assert result.returncode == 0, result.stderr[-3000:]
    (work / "stdout.txt").write_text(result.stdout)
    return work


@pytest.mark.slow
def test_ddp_fit_writes_one_run_from_rank_zero(ddp_run: Path) -> None:
    assert sorted(p.name for p in (ddp_run / "logs").iterdir()) == ["ddp"]
    assert sorted(p.name for p in (ddp_run / "checkpoints").iterdir()) == ["ddp"]
    assert len(list((ddp_run / "logs" / "ddp").glob("events.out.tfevents.*"))) == 1
    saved = yaml.safe_load((ddp_run / "logs" / "ddp" / "config.yaml").read_text())
    assert saved["trainer"]["strategy"] == "ddp" and str(saved["trainer"]["devices"]) == "2"
    checkpoint = torch.load(ddp_run / "checkpoints" / "ddp" / "last.ckpt", weights_only=False)
    # 48 training images over 2 ranks = 24 each: one full batch of 16 per rank and epoch
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (0, 1)


# room: cache begin
@pytest.mark.slow
def test_auto_cache_is_decided_once_for_every_process(ddp_run: Path) -> None:
    """Rank 0 decides (for 2 copies on this machine) and says so once; both ranks then read the cache."""
    out = (ddp_run / "stdout.txt").read_text()
    notices = [line for line in out.splitlines() if "(--data.cache=auto)" in line]
    assert len(notices) == 1 and "per process x 2" in notices[0]
    assert out.count("Cached 48 train images") == 2 and out.count("Cached 23 val images") == 2


# room: cache end
@pytest.mark.slow
def test_validation_counts_each_image_once(ddp_run: Path, odd_root: Path) -> None:
    checkpoint = str(ddp_run / "checkpoints" / "ddp" / "last.ckpt")
    flags = ["--ckpt_path", checkpoint, *fast_args(odd_root)]
    two = run_module(ddp_run, "validate", *DDP, "--trainer.devices=2", *flags)
    one = run_module(ddp_run, "validate", "--trainer.accelerator=cpu", *flags)
    assert two.returncode == 0 and one.returncode == 0, two.stderr[-2000:] + one.stderr[-2000:]
    single, double = metrics(one.stdout), metrics(two.stdout)
    assert {"val/acc", "val/loss", "val/f1_macro", "val/top5_acc"} <= set(single)
    for key in ("val/acc", "val/f1_macro", "val/top5_acc", "val/loss"):
        assert double[key] == pytest.approx(single[key], rel=1e-5), key
    assert round(single["val/acc"] * 23) == pytest.approx(single["val/acc"] * 23, abs=1e-4)  # k of 23


@pytest.mark.slow
def test_ddp_checkpoint_predicts_and_exports_on_one_cpu(
    ddp_run: Path, odd_root: Path, workdir: Path, capsys
) -> None:
    checkpoint = ddp_run / "checkpoints" / "ddp" / "last.ckpt"
    args = ["--ckpt_path", str(checkpoint), f"--data.predict_dir={odd_root / 'val'}", "--data.num_workers=0"]
    assert run_cli("predict", *args, "--predictions.output=p.csv", "--trainer.accelerator=cpu") == 0
    assert len((workdir / "p.csv").read_text().splitlines()) == 1 + 23
    assert run_cli("export", "--ckpt_path", str(checkpoint), f"--output_dir={workdir / 'exported'}") == 0
    assert len(list((workdir / "exported").glob("ddp-val_acc=*.onnx"))) == 1


@pytest.mark.slow
def test_ddp_predict_writes_each_image_exactly_once(ddp_run: Path, odd_root: Path, tmp_path: Path) -> None:
    checkpoint = ddp_run / "checkpoints" / "ddp" / "last.ckpt"
    args = ["--ckpt_path", str(checkpoint), f"--data.predict_dir={odd_root / 'val'}", "--data.num_workers=0"]
    two = run_module(tmp_path, "predict", *DDP, "--trainer.devices=2", *args, "--predictions.output=two.csv")
    one = run_module(tmp_path, "predict", "--trainer.accelerator=cpu", *args, "--predictions.output=one.csv")
    assert two.returncode == 0 and one.returncode == 0, two.stderr[-2000:] + one.stderr[-2000:]
    with open(tmp_path / "two.csv") as f:
        rows = list(csv.DictReader(f))
    files = sorted(str(Path(p).relative_to(odd_root / "val")) for p in (odd_root / "val").rglob("*.jpg"))
    assert [row["file"] for row in rows] == files and len(files) == 23  # both ranks' images, each once
    with open(tmp_path / "one.csv") as f:
        assert [row["class_name"] for row in csv.DictReader(f)] == [row["class_name"] for row in rows]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_on_loopback_train_together(tmp_path: Path, shapes_root: Path) -> None:
    port = free_port()
    flags = [*DDP, *fast_args(shapes_root, "--name=nodes", "--trainer.devices=1", "--trainer.num_nodes=2")]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={rank}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                "-m",
                "project",
                "fit",
                *flags,
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(err[-2000:] for _, err in outputs)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["nodes"]
    assert len(list((tmp_path / "logs" / "nodes").glob("events.out.tfevents.*"))) == 1
    checkpoint = torch.load(tmp_path / "checkpoints" / "nodes" / "last.ckpt", weights_only=False)
    assert (checkpoint["epoch"], checkpoint["global_step"]) == (0, 1)  # 48 images over 2 nodes, 16 per batch


def test_launched_processes_need_a_run_name(workdir: Path, shapes_root: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert run_cli("fit", *fast_args(shapes_root)) == 2
    assert "runs as 2 processes started by a launcher" in capsys.readouterr().err
    assert not (workdir / "logs").exists()


def test_fsdp_config_builds_the_strategy() -> None:
    from jsonargparse import ArgumentParser
    from lightning.pytorch.strategies import FSDPStrategy, Strategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from torchvision.models.vision_transformer import EncoderBlock

    config = yaml.safe_load((ROOT / "configs" / "presets" / "fsdp.yaml").read_text())["trainer"]
    parser = ArgumentParser()
    parser.add_argument("--strategy", type=Strategy)
    strategy = parser.instantiate_classes(parser.parse_object({"strategy": config["strategy"]})).strategy
    assert isinstance(strategy, FSDPStrategy) and strategy.sharding_strategy.name == "FULL_SHARD"
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy) and EncoderBlock in policy._module_classes


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FSDP needs CUDA GPUs: Lightning refuses it on CPU")
def test_fsdp_fit_on_gpus(tmp_path: Path, shapes_root: Path) -> None:
    fsdp = ["--config", str(ROOT / "configs" / "presets" / "fsdp.yaml")]
    args = fast_args(shapes_root, "--name=fsdp", "--model.backbone=vit_b_16", "--data.image_size=224")
    result = run_module(tmp_path, "fit", *fsdp, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = tmp_path / "checkpoints" / "fsdp" / "last.ckpt"
    assert run_cli("export", "--ckpt_path", str(checkpoint), f"--output_dir={tmp_path / 'x'}") == 0
