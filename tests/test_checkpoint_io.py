"""Checkpoint files: atomic writes, a full disk, and checkpoints that try to run code when loaded."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import project.atomic
from project.atomic import atomic_write
from project.callbacks.rng_state import RNGState
from project.checkpoint_io import AtomicCheckpointIO, UnsafeCheckpointError, load_checkpoint_file
from project.errors import UserError
from tests.helpers import RunsCode, fast_args, run_cli, write_deflated


def fail_writes_halfway(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write stores half its bytes, then reports a full disk, as a real full disk does."""

    def write(fd: int, data: memoryview) -> int:
        os.write(fd, data[: max(1, len(data) // 2)])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(project.atomic, "_write", write)


def test_atomic_write_leaves_the_old_file_or_the_new_one(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "file.bin"
    atomic_write(target, b"old" * 1000)
    fail_writes_halfway(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, b"new" * 1000)
    assert target.read_bytes() == b"old" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.bin"]  # the partial file was removed
    monkeypatch.undo()
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"


def test_checkpoint_is_renamed_into_place_from_a_hidden_partial(tmp_path: Path, monkeypatch) -> None:
    renames, syncs = [], []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(
        project.atomic.os, "replace", lambda a, b: (renames.append((a, b)), real_replace(a, b))
    )
    monkeypatch.setattr(project.atomic.os, "fsync", lambda fd: (syncs.append(fd), real_fsync(fd)))
    path = tmp_path / "run" / "last.ckpt"
    checkpoint_io = AtomicCheckpointIO()
    checkpoint_io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "epoch": 1}, path)
    checkpoint_io.teardown()  # the write ran on the background thread: done by now
    [(partial, final)] = renames
    assert final == path and partial.parent == path.parent
    assert partial.name.startswith(".last.ckpt.") and partial.name.endswith(".partial")
    assert len(syncs) == 2  # the file, then its folder
    assert torch.equal(AtomicCheckpointIO().load_checkpoint(path)["state_dict"]["w"], torch.ones(3))


def test_two_writers_of_one_file_each_rename_their_own(tmp_path: Path) -> None:
    """Writers of one name at once (two sweeps summarizing one study) used to share the temporary file:
    the second rename found it gone (FileNotFoundError) or the file mixed both writers' bytes."""
    target = tmp_path / "picture.png"
    first, second = project.atomic.partial_path(target), project.atomic.partial_path(target)
    assert first != second
    barrier = threading.Barrier(8)

    def write(n: int) -> None:
        barrier.wait()
        atomic_write(target, bytes([n]) * 1_000_000)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    data = target.read_bytes()
    assert len(data) == 1_000_000 and len(set(data)) == 1  # one writer's whole file
    assert [p.name for p in tmp_path.iterdir()] == ["picture.png"]


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.slow
def test_full_disk_keeps_earlier_checkpoints_and_says_what_to_free(
    workdir: Path, shapes_root: Path, monkeypatch, capsys
) -> None:
    configs = []
    monkeypatch.setattr("project.callbacks.save_config.atomic_write", lambda path, data: configs.append(path))
    small = "--model.backbone=mobilenet_v3_small"  # 18 MB checkpoints instead of 135 MB
    short = ["--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1", small]
    assert run_cli("fit", *fast_args(shapes_root, "--name=full", *short)) == 0
    assert configs == [Path("logs/full/config.yaml")]  # the saved config goes through atomic_write too
    run = workdir / "checkpoints" / "full"
    before = digests(run)
    assert len(before) == 2  # epoch=000-val_acc=....ckpt and last.ckpt
    fail_writes_halfway(monkeypatch)
    resume = ["--name=full", "--ckpt_path=last", "--trainer.max_epochs=2", *short]
    assert run_cli("fit", *fast_args(shapes_root, *resume)) == 2
    err = capsys.readouterr().err
    assert re.search(
        r"error: No space left on the disk to write checkpoint '[^']*checkpoints/full/epoch=001", err
    )
    assert re.search(r"the checkpoints already in '[^']*checkpoints/full' are intact", err)
    assert re.search(r"Fix: free at least [\d.]+ MB on that disk", err)
    assert "--name full --ckpt_path last" in err
    assert digests(run) == before  # nothing changed, no partial file left behind
    assert load_checkpoint_file(run / "last.ckpt")["epoch"] == 0


@pytest.fixture
def crafted(workdir: Path) -> tuple[Path, Path]:
    """A checkpoint inside a run folder whose unpickling would create `marker`."""
    marker = workdir / "code-ran"
    path = workdir / "checkpoints" / "evil" / "last.ckpt"
    path.parent.mkdir(parents=True)
    torch.save({"state_dict": {}, "hyper_parameters": {"num_classes": 2}, "payload": RunsCode(marker)}, path)
    return path, marker


def test_crafted_checkpoint_is_refused_by_every_loader(crafted: tuple[Path, Path]) -> None:
    path, marker = crafted
    for load in (load_checkpoint_file, AtomicCheckpointIO().load_checkpoint):
        with pytest.raises(
            UnsafeCheckpointError, match=r"Refused to load checkpoint .*posix\.system.*Nothing"
        ):
            load(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["fit", "--ckpt_path=last", "--name=evil"],
        ["fit", "--ckpt_path={path}"],
        ["validate", "--ckpt_path={path}"],
        ["test", "--ckpt_path={path}"],
        ["predict", "--ckpt_path={path}", "--data.predict_dir=."],
        ["export", "--ckpt_path={path}"],
        ["fit", "--model.weights={path}", "--name=uses-weights"],
    ],
    ids=["fit-last", "fit", "validate", "test", "predict", "export", "model.weights"],
)
def test_crafted_checkpoint_runs_nothing_on_any_command(
    crafted: tuple[Path, Path], shapes_root: Path, args: list[str], capsys
) -> None:
    path, marker = crafted
    command, *rest = (a.format(path=path) for a in args)
    assert run_cli(command, *fast_args(shapes_root, *rest)) == 2
    err = capsys.readouterr().err
    assert re.search(r"error: Refused to load checkpoint '[^']*checkpoints/evil/last.ckpt'", err)
    assert "Traceback" not in err
    assert not marker.exists()


@pytest.mark.parametrize(
    ("contents", "key", "shown"),
    [
        ({"state_dict": {}}, "pytorch-lightning_version", "None"),
        ({"state_dict": {}, "pytorch-lightning_version": "abc"}, "pytorch-lightning_version", "'abc'"),
        ({"pytorch-lightning_version": "2.6.0"}, "state_dict", "None"),
    ],
    ids=["no-version", "bad-version", "no-state-dict"],
)
@pytest.mark.parametrize("command", ["fit", "validate", "export"])
def test_a_checkpoint_without_the_keys_lightning_reads_is_one_error(
    workdir: Path, shapes_root: Path, capsys, contents: dict, key: str, shown: str, command: str
) -> None:
    """Lightning reads these without a check: a KeyError or InvalidVersion traceback otherwise."""
    path = workdir / "crafted.ckpt"
    torch.save({"hyper_parameters": {"num_classes": 6}, **contents}, path)
    assert run_cli(command, *fast_args(shapes_root, f"--ckpt_path={path}")) == 2
    err = capsys.readouterr().err
    assert f"error: Refused checkpoint '{path}': its setting '{key}' is {shown}, expected " in err
    assert "Traceback" not in err and " Fix: " in err


def test_truncated_checkpoint_is_one_message(tmp_path: Path) -> None:
    path = tmp_path / "cut.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}}, path)
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(UserError, match=r"Cannot read checkpoint '.*cut.ckpt'.*truncated"):
        load_checkpoint_file(path)


def test_a_checkpoint_declaring_more_data_than_its_file_holds_is_refused_before_loading(
    tmp_path: Path,
) -> None:
    # its 100 MB tensor entry deflated: a 100 kB file that declares 100 MB
    plain, bomb = tmp_path / "plain.ckpt", tmp_path / "bomb.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(25_000_000)}}, plain)
    write_deflated({"state_dict": {"w": torch.zeros(25_000_000)}}, bomb)
    size = bomb.stat().st_size
    assert size < 1_000_000
    for load in (load_checkpoint_file, AtomicCheckpointIO(background=False).load_checkpoint):
        with pytest.raises(UserError) as caught:
            load(bomb)
        message = str(caught.value)
        assert message.startswith(f"Refused to load checkpoint '{bomb}': its entries declare 100,00")
        assert (
            f"more than the file's {size:,} bytes" in message and "Fix: use a checkpoint written" in message
        )
    assert load_checkpoint_file(plain)["state_dict"]["w"].shape == (25_000_000,)  # stored: loads as before


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    callback = RNGState()
    torch.save({"rng": callback.state_dict()}, tmp_path / "rng.ckpt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    callback.load_state_dict(load_checkpoint_file(tmp_path / "rng.ckpt")["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_atomic_files_renames_all_in_order_or_none(tmp_path: Path, monkeypatch) -> None:
    model, sidecar = tmp_path / "m.onnx", tmp_path / "m.json"
    sidecar.write_text("old")
    with pytest.raises(RuntimeError), project.atomic.atomic_files(model, sidecar) as [a, b]:
        a.write_bytes(b"model")
        raise RuntimeError("verification failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"] and sidecar.read_text() == "old"
    renames, real_replace = [], os.replace
    monkeypatch.setattr(project.atomic.os, "replace", lambda a, b: (renames.append(b), real_replace(a, b)))
    with project.atomic.atomic_files(model, sidecar) as [a, b]:
        a.write_bytes(b"model")
        b.write_text("new")
    assert renames == [model, sidecar]  # the sidecar appears last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.onnx"] and sidecar.read_text() == "new"


def test_background_write_keeps_the_state_of_the_save_and_loads_wait_for_it(
    tmp_path: Path, monkeypatch
) -> None:
    release = threading.Event()
    real_write = project.checkpoint_io.atomic_write
    monkeypatch.setattr(
        project.checkpoint_io, "atomic_write", lambda path, data: (release.wait(10), real_write(path, data))
    )
    checkpoint_io, path, weights = AtomicCheckpointIO(), tmp_path / "last.ckpt", torch.ones(3)
    checkpoint_io.save_checkpoint({"state_dict": {"w": weights}}, path)
    assert not path.exists()  # save returned; the file is still being written
    weights.add_(1)  # training goes on and changes the tensors in place
    threading.Timer(0.2, release.set).start()
    loaded = checkpoint_io.load_checkpoint(path)  # waits for the write
    assert torch.equal(loaded["state_dict"]["w"], torch.ones(3))  # the state at the save
    checkpoint_io.teardown()


def test_after_a_failed_background_write_nothing_is_removed_and_the_error_is_raised(
    tmp_path: Path, monkeypatch
) -> None:
    checkpoint_io = AtomicCheckpointIO()
    old = tmp_path / "epoch=000.ckpt"
    checkpoint_io.save_checkpoint({"epoch": 0}, old)
    checkpoint_io.wait()
    fail_writes_halfway(monkeypatch)
    checkpoint_io.save_checkpoint({"epoch": 1}, tmp_path / "epoch=001.ckpt")  # fails in the background
    checkpoint_io.remove_checkpoint(old)  # what Lightning asks next: queued after the failed write
    with pytest.raises(UserError, match=r"No space left on the disk to write checkpoint '.*epoch=001.ckpt'"):
        checkpoint_io.teardown()
    assert [p.name for p in tmp_path.iterdir()] == ["epoch=000.ckpt"]  # kept, and no partial file
    assert load_checkpoint_file(old)["epoch"] == 0


def test_a_slow_disk_holds_back_the_saves_instead_of_queueing_them(tmp_path: Path, monkeypatch) -> None:
    """Each queued write holds a whole checkpoint in memory: at most MAX_PENDING wait, then save blocks."""
    release, started, returned = threading.Event(), [], []
    real_write = project.checkpoint_io.atomic_write

    def slow_write(path: Path, data: memoryview) -> None:
        started.append(path.name)
        release.wait(10)
        real_write(path, data)

    def save_five() -> None:
        for n in range(5):
            checkpoint_io.save_checkpoint({"n": n}, tmp_path / f"{n}.ckpt")
            returned.append(n)

    monkeypatch.setattr(project.checkpoint_io, "atomic_write", slow_write)
    checkpoint_io = AtomicCheckpointIO()
    saver = threading.Thread(target=save_five)
    saver.start()
    try:
        saver.join(1.0)
        # saves 0 and 1 are queued; save 2 waits for the disk
        assert saver.is_alive() and returned == [0, 1] and project.checkpoint_io.MAX_PENDING == 2
    finally:
        release.set()
        saver.join(10)
    checkpoint_io.teardown()
    assert returned == [0, 1, 2, 3, 4] and started == [f"{n}.ckpt" for n in range(5)]  # in order
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{n}.ckpt" for n in range(5)]
