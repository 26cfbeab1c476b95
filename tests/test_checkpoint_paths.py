"""A checkpoint from elsewhere, resumed: the paths in its ModelCheckpoint state never make the run remove
anything outside its own checkpoint folder, nor a folder at all."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

from project.callbacks.checkpoint_paths import PATH_KEYS, trusted_state
from project.checkpoint_io import AtomicCheckpointIO
from tests.helpers import fast_args, run_cli


def crafted(source: Path, path: Path, **state: object) -> Path:
    """`source` with its ModelCheckpoint state replaced by `state`, `dirpath` left out (so Lightning
    restores every path); weights-only loadable."""
    checkpoint = torch.load(source, weights_only=True)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("ModelCheckpoint")]
    kept = {k: v for k, v in checkpoint["callbacks"][key].items() if k != "dirpath"}
    checkpoint["callbacks"][key] = {**kept, **state}
    torch.save(checkpoint, path)
    return path


def victim_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "inside.txt").write_text("keep me")
    return path


@pytest.mark.slow
def test_resuming_a_crafted_checkpoint_removes_nothing_outside_the_run(
    workdir: Path, shapes_root: Path, tmp_path: Path
) -> None:
    assert run_cli("fit", *fast_args(shapes_root, "--name=src")) == 0
    file = workdir / "notes.txt"
    file.write_text("keep me")
    folder = victim_folder(workdir / "data")
    outside = victim_folder(tmp_path / "elsewhere" / "models")
    up = "checkpoints/res/../.."  # Lightning sees checkpoints/res among the parents and removes
    path = crafted(
        workdir / "checkpoints" / "src" / "last.ckpt",
        tmp_path / "handed-around.ckpt",
        last_model_path=f"{up}/notes.txt",  # replaced by the next last.ckpt
        # the worst of the top 3 is removed when a better checkpoint comes: one per epoch here
        best_k_models={
            f"{up}/data": torch.tensor(-3.0),
            f"{workdir}/{up}/../elsewhere/models": torch.tensor(-2.0),
            str(outside.parent): torch.tensor(-1.0),
        },
        kth_best_model_path=f"{up}/data",
        kth_value=torch.tensor(-3.0),
        best_model_path=str(outside),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = run_cli(
            "fit", *fast_args(shapes_root, "--name=res", "--trainer.max_epochs=3"), f"--ckpt_path={path}"
        )
    assert status == 0
    assert file.read_text() == "keep me"
    assert (folder / "inside.txt").read_text() == "keep me"
    assert (outside / "inside.txt").read_text() == "keep me"
    said = [str(w.message) for w in caught if "ModelCheckpoint state names" in str(w.message)]
    assert len(said) == 1 and "names 5 path(s) that are not checkpoint files in this run's folder" in said[0]
    # the run's own checkpoints are kept as before: its top 3 (of 2 epochs) and last
    run = sorted(p.name.split("-")[0] for p in (workdir / "checkpoints" / "res").iterdir())
    assert run == ["epoch=001", "epoch=002", "last.ckpt"]


def test_the_checkpoint_io_removes_only_files_of_the_run(tmp_path: Path) -> None:
    run = tmp_path / "checkpoints" / "run"
    run.mkdir(parents=True)
    own = run / "epoch=000.ckpt"
    own.write_bytes(b"x")
    target = tmp_path / "target.txt"
    target.write_text("keep me")
    link = run / "last.ckpt"
    link.symlink_to(target)
    folder = victim_folder(run / "epoch=001.ckpt")
    io = AtomicCheckpointIO(background=False)
    io.folders = lambda: [str(run)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        io.remove_checkpoint(str(folder))  # a folder, even inside the run
        io.remove_checkpoint(str(target))  # outside the run
        io.remove_checkpoint(f"{run}/../../target.txt")
    assert (folder / "inside.txt").exists() and target.exists()
    assert [str(w.message).split(": ", 1)[1] for w in caught] == [
        "it is not a file. It was left in place.",
        *2 * [f"it is outside the run's checkpoint folder ({os.path.realpath(run)}). It was left in place."],
    ]
    io.remove_checkpoint(str(link))  # the link only, never what it points at
    io.remove_checkpoint(str(own))
    assert not link.is_symlink() and not own.exists() and target.read_text() == "keep me"


def test_the_tuners_restore_checkpoint_is_removed_without_a_warning(tmp_path: Path) -> None:
    """lr_find and batch_size_find save a restore checkpoint in the trainer's default_root_dir (logs/<run>)
    and remove it after the search: that file, and only a file of that name there, is the run's."""
    logs, run = tmp_path / "logs" / "probe", tmp_path / "checkpoints" / "probe"
    logs.mkdir(parents=True)
    restore = logs / ".lr_find_491307e4-12f7-4bdf-8e2e-46f21ff2b192.ckpt"
    restore.write_bytes(b"x")
    config = logs / "config.yaml"
    config.write_text("keep me")
    io = AtomicCheckpointIO(background=False)
    io.folders, io.tuner_folder = lambda: [str(run)], lambda: str(logs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        io.remove_checkpoint(str(restore))
        io.remove_checkpoint(str(config))
    assert not restore.exists() and config.read_text() == "keep me"
    assert [str(w.message).split(": ", 1)[0] for w in caught] == [f"Checkpoint removal of '{config}' refused"]


def test_a_runs_own_paths_are_kept_and_the_top_k_stays_consistent(tmp_path: Path) -> None:
    """A resume of the run itself keeps its state as it is; a dropped path is replaced as Lightning would."""
    run = tmp_path / "checkpoints" / "r"
    run.mkdir(parents=True)
    files = [run / f"epoch={e:03d}.ckpt" for e in range(3)]
    for file in [*files, run / "last.ckpt"]:
        file.write_bytes(b"x")
    state = {
        "monitor": "val/acc",
        "best_model_score": torch.tensor(0.3),
        "best_model_path": str(files[2]),
        "dirpath": str(run),
        "best_k_models": {str(f): torch.tensor(0.1 * (i + 1)) for i, f in enumerate(files)},
        "kth_best_model_path": str(files[0]),
        "kth_value": torch.tensor(0.1),
        "last_model_path": str(run / "last.ckpt"),
    }
    clean, dropped = trusted_state(state, str(run), "max")
    assert dropped == []
    assert {k: clean[k] for k in PATH_KEYS} == {k: state[k] for k in PATH_KEYS}
    assert list(clean["best_k_models"]) == list(state["best_k_models"])
    assert float(clean["kth_value"]) == pytest.approx(0.1)
    assert float(clean["best_model_score"]) == pytest.approx(0.3)

    outside = str(tmp_path / "notes.txt")
    scores = {outside: torch.tensor(-1.0), str(files[1]): torch.tensor(0.2), str(files[2]): 0.3}
    state["best_k_models"] = scores
    state["kth_best_model_path"] = outside
    clean, dropped = trusted_state(state, str(run), "max")
    assert dropped == [outside]
    assert clean["kth_best_model_path"] == str(files[1]) and float(clean["kth_value"]) == pytest.approx(0.2)
    assert list(clean["best_k_models"]) == [str(files[1]), str(files[2])]
