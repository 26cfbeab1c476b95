"""`python -m project audit`: its files, planted duplicates and leaks, label ranking, read-only data."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import logging
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from project.audit.command import check_clean_path, main
from project.audit.data import AuditDataModule
from project.audit.duplicates import Thresholds, find_duplicates
from project.audit.folds import Recipe
from project.audit.images import phash
from project.audit.labels import find_label_issues
from project.audit.report import chance_warning
from project.audit.stop import Stopped, raise_if_stopped, stop_on_ctrl_c
from project.audit.timing import CPU_BUDGET_S, StepTime, default_folds, plan_folds
from project.data.shapes import CLASSES
from project.errors import UserError
from tests.helpers import exit_status

TINY = [
    "--data.image_size=32",
    "--data.batch_size=16",
    "--data.num_workers=0",
    "--model.backbone=resnet18",
    "--model.scheduler.init_args.warmup_steps=1",
    "--trainer.enable_progress_bar=false",
    "--folds=2",
    "--epochs=1",
]
EXACT = ("train/circle/00000.jpg", "val/circle/copy-exact.jpg")
RESIZED = ("train/square/00001.jpg", "val/square/copy-resized.jpg")
BROKEN = "train/star/broken.jpg"


def run_audit(*args: str) -> int:
    return exit_status(main, *args)


def fingerprint(root: Path) -> dict[str, str]:
    """Every file under `root` (hidden ones too) and the sha256 of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def audited(shapes_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The shapes (6 classes x 12) plus an exact and a resized copy in val, a broken file; audited once."""
    base = tmp_path_factory.mktemp("audit")
    data = base / "data"
    shutil.copytree(shapes_root, data)
    shutil.copy(data / EXACT[0], data / EXACT[1])
    Image.open(data / RESIZED[0]).resize((44, 44), Image.Resampling.BICUBIC).save(
        data / RESIZED[1], quality=75
    )
    (data / BROKEN).write_bytes(b"\xff\xd8\xff not really a jpeg")
    config = base / "audit.yaml"
    config.write_text("data:\n  crop_ratio: 1.0\n")  # a --config like fit's
    before = fingerprint(data)
    work = base / "work"
    work.mkdir()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()) as stdout:
        mp.chdir(work)
        status = run_audit(
            f"--data.root={data}",
            f"--config={config}",
            *TINY,
            "--name=a",
            f"--write_clean={base / 'keep.txt'}",
        )
    return {
        "status": status,
        "data": data,
        "before": before,
        "out": work / "logs" / "a" / "audit",
        "base": base,
        "stdout": stdout.getvalue(),
    }


@pytest.mark.slow
def test_audit_writes_every_file_with_its_columns(audited: dict) -> None:
    assert audited["status"] == 0
    out = audited["out"]
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask  # not a private temporary folder's 0700
    header = {
        "label_issues.csv": ["rank", "file", "split", "given_label", "suggested_label", "label_quality"],
        "duplicates.csv": ["file_a", "file_b", "similarity", "kind", "leak"],
        "outliers.csv": ["rank", "file", "split", "label", "typicality_percentile"],
        "oof_probabilities.csv": [
            "file",
            "split",
            "label",
            "fold",
            "label_quality",
            "p_circle",
            "p_triangle",
        ],
    }
    for name, columns in header.items():
        with open(out / name, newline="") as f:
            found = next(csv.reader(f))
        assert set(columns) <= set(found), name
    rows = read(out / "oof_probabilities.csv")
    assert len(rows) == 6 * 12 + 2  # every readable image once, the broken one not
    probs = np.array([[float(r[f"p_{c}"]) for c in CLASSES]
                      for r in rows])  # fmt: skip
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    assert {r["fold"] for r in rows} == {"0", "1"}
    page = (out / "report.html").read_text()
    assert page.count('<img src="data:image/jpeg;base64,') >= 4  # at least the two planted pairs


@pytest.mark.slow
def test_planted_exact_and_resized_copies_are_leaks(audited: dict) -> None:
    pairs = {frozenset((r["file_a"], r["file_b"])): r for r in read(audited["out"] / "duplicates.csv")}
    exact, resized = pairs[frozenset(EXACT)], pairs[frozenset(RESIZED)]
    assert (exact["kind"], exact["leak"], float(exact["similarity"])) == ("exact", "true", 1.0)
    assert (resized["kind"], resized["leak"]) == ("near", "true")


@pytest.mark.slow
def test_data_folder_is_unchanged(audited: dict) -> None:
    assert fingerprint(audited["data"]) == audited["before"]


@pytest.mark.slow
def test_bad_file_is_skipped_and_listed(audited: dict) -> None:
    listed = (audited["out"] / "skipped_files.txt").read_text()
    assert BROKEN in listed and "\t" in listed
    assert BROKEN not in (audited["out"] / "oof_probabilities.csv").read_text()
    assert "broken.jpg" in (audited["out"] / "report.html").read_text()


@pytest.mark.slow
def test_write_clean_lists_files_and_moves_nothing(audited: dict) -> None:
    keep = (audited["base"] / "keep.txt").read_text().splitlines()
    assert keep and all((audited["data"] / name).is_file() for name in keep)
    assert BROKEN not in keep
    # one of each planted pair stays: the evaluation split's (val) copy, the training one goes
    assert EXACT[0] not in keep or EXACT[1] not in keep
    assert len(fingerprint(audited["data"])) == len(audited["before"])


def test_label_ranking_puts_flipped_labels_first() -> None:
    """Out-of-fold probabilities sure of another class than 3 given labels: those 3 lead the ranking."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 25)
    truth = labels.copy()
    flipped = np.array([3, 40, 77])
    labels[flipped] = (labels[flipped] + 1) % 4
    probs = rng.dirichlet(np.ones(4) * 0.3, size=100) * 0.2
    probs[np.arange(100), truth] += 0.8
    probs[flipped] = 0.01
    probs[flipped, truth[flipped]] = 0.97  # the models are sure of the true class
    issues = find_label_issues(labels, probs)
    assert set(issues.ranked[:3].tolist()) == set(flipped.tolist())
    assert [issues.suggested[i] for i in flipped] == [[int(truth[i])] for i in flipped]
    assert issues.quality[flipped].max() < np.delete(issues.quality, flipped).min()


def test_label_ranking_forks_no_process_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool forked from the audit's threaded process can hang on a copied lock: cleanlab runs in-process."""

    def no_pool(*args: object, **kwargs: object) -> None:
        raise AssertionError("cleanlab started a process pool")

    monkeypatch.setattr(multiprocessing, "Pool", no_pool)
    monkeypatch.setattr(multiprocessing.context.BaseContext, "Pool", no_pool)
    labels = np.repeat(np.arange(3), 20)
    probs = np.full((60, 3), 0.05)
    probs[np.arange(60), labels] = 0.9
    assert len(find_label_issues(labels, probs).quality) == 60
    assert len(find_label_issues(np.eye(3, dtype=np.uint8)[labels], probs).quality) == 60  # room: multilabel


# room: multilabel begin
def test_label_ranking_multilabel() -> None:
    labels = np.zeros((60, 3), dtype=np.uint8)
    labels[np.arange(60), np.arange(60) % 3] = 1
    probs = np.where(labels == 1, 0.9, 0.05).astype(np.float64)
    labels[7] = [0, 0, 1]  # the model is sure it is class 1 only
    issues = find_label_issues(labels, probs)
    assert issues.ranked[0] == 7 and issues.suggested[7] == [1]


# room: multilabel end


def test_duplicates_leak_only_across_splits_and_need_close_colours() -> None:
    hashes = np.zeros((5, 64), dtype=bool)
    hashes[2:, :32] = True  # 0~1 and 2~3~4 alike in hash, the two groups 32 bits apart
    thumbs = np.zeros((5, 192), dtype=np.float32)
    thumbs[4] = 100.0  # 4: the same grayscale layout in other colours
    splits = np.array(["all", "all", "train", "val", "val"])
    pairs = find_duplicates(["x", "x", "y", "z", "w"], hashes, thumbs, None, splits, Thresholds(6, 10.0, 1.0))
    assert [(p.a, p.b, p.kind, p.leak) for p in pairs] == [(0, 1, "exact", False), (2, 3, "near", True)]


def test_embeddings_vouch_only_for_moderate_colour_changes() -> None:
    hashes = np.zeros((3, 64), dtype=bool)
    thumbs = np.array([[0.0] * 192, [15.0] * 192, [25.0] * 192], dtype=np.float32)
    embedding = np.ones((3, 4), dtype=np.float32) / 2  # unit rows, all alike
    pairs = find_duplicates(["a", "b", "c"], hashes, thumbs, embedding, np.array(["all"] * 3), Thresholds())
    assert [(p.a, p.b) for p in pairs] == [(1, 2), (0, 1)]  # 10 and 15 levels apart; 0~2 (25) is not


def test_phash_survives_resizing_and_recompression(shapes_root: Path, tmp_path: Path) -> None:
    original = Image.open(shapes_root / "train" / "star" / "00002.jpg").resize((128, 128))
    original.resize((96, 96)).save(tmp_path / "copy.jpg", quality=60)
    other = Image.open(shapes_root / "train" / "ring" / "00003.jpg").resize((128, 128))
    a, b, c = (
        phash(np.asarray(im.convert("RGB"))) for im in (original, Image.open(tmp_path / "copy.jpg"), other)
    )
    assert (a != b).sum() <= 4 < (a != c).sum()


def test_unsplit_layouts_are_audited_whole(flat_root: Path, tmp_path: Path) -> None:
    assert list(AuditDataModule(root=str(flat_root)).splits) == ["all"]
    train_only = tmp_path / "train_only"
    shutil.copytree(flat_root, train_only / "train")
    assert list(AuditDataModule(root=str(train_only)).splits) == ["train"]
    split = AuditDataModule(root=str(flat_root), val_split=0.25).splits  # as fit would split it
    assert list(split) == ["train", "val"]


def test_too_many_folds_is_one_message(
    shapes_root: Path, workdir: Path, capsys: pytest.CaptureFixture
) -> None:
    assert run_audit(f"--data.root={shapes_root}", *TINY, "--folds=13") == 2
    err = capsys.readouterr().err
    assert "--folds=13" in err and "Fix:" in err and "Traceback" not in err
    assert run_audit(f"--data.root={shapes_root}", *TINY, "--folds=1") == 2
    assert "--folds=1" in capsys.readouterr().err


def test_write_clean_never_inside_the_data_or_over_a_file(shapes_root: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="inside the data folder"):
        check_clean_path(str(shapes_root / "keep.txt"), shapes_root)
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="already exists"):
        check_clean_path(str(tmp_path / "keep.txt"), shapes_root)


def test_missing_cleanlab_is_one_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "cleanlab" else real(name, *a)
    )
    assert run_audit("--data.root=nowhere") == 2
    assert "pip install -e '.[audit]'" in capsys.readouterr().err


# room: multilabel begin
@pytest.mark.slow
def test_multilabel_csv_is_audited(tmp_path: Path, workdir: Path) -> None:
    """A labels CSV: random folds, sigmoid probabilities per label, label sets in the CSVs."""
    from project.data.multishapes import generate_multishapes

    csv_path = generate_multishapes(tmp_path / "multi", 24, 8, image_size=32) / "labels.csv"
    assert run_audit(f"--data.labels_csv={csv_path}", *TINY, "--name=m") == 0
    out = workdir / "logs" / "m" / "audit"
    rows = read(out / "oof_probabilities.csv")
    assert len(rows) == 32 and {r["split"] for r in rows} == {"train", "val"}
    assert any(len(r["label"].split()) > 1 for r in rows)  # label sets, space-separated
    probs = np.array([[float(v) for k, v in r.items() if k.startswith("p_")] for r in rows])
    assert ((probs >= 0) & (probs <= 1)).all() and not np.allclose(probs.sum(axis=1), 1.0)
    header = (out / "label_issues.csv").read_text().splitlines()[0]
    assert "given_label" in header and "suggested_label" in header


# room: multilabel end


@pytest.mark.parametrize(
    "flags",
    [
        ("--data.balance=sampler",),  # room: recipes
        ("--data.balance=loss",),  # room: recipes
        ("--data.mixup_alpha=0.2", "--data.cutmix_alpha=1.0"),  # room: recipes
        ("--ema.decay=0.99",),  # room: ema
    ],
)
def test_fit_recipe_options_the_folds_do_not_use_are_refused(
    shapes_root: Path, workdir: Path, capsys: pytest.CaptureFixture, flags: tuple[str, ...]
) -> None:
    assert run_audit(f"--data.root={shapes_root}", *TINY, *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: audit does not use {', '.join(flags)}: its fold models train a plain")
    assert "Fix: leave" in err and "Traceback" not in err
    assert not (workdir / "logs").exists()  # refused before anything is read or trained


def test_fold_models_near_chance_are_warned_about() -> None:
    assert chance_warning(0.30, 1 / 6) is not None  # 6 classes: below 1/6 + 0.2 x 5/6 = 0.333
    assert chance_warning(0.34, 1 / 6) is None
    assert chance_warning(0.55, 0.5) is not None and chance_warning(0.95, 0.5) is None
    warning = chance_warning(0.2, 0.25)
    assert warning is not None and "out-of-fold accuracy 0.200, against 0.250" in warning
    assert "Fix: train the folds longer (--epochs)" in warning


@pytest.mark.slow
def test_the_audit_says_when_its_fold_models_are_near_chance(audited: dict) -> None:
    """One epoch on 36 images a fold: the models barely learn, and the report says so."""
    rows = read(audited["out"] / "oof_probabilities.csv")
    accuracy = np.mean([max(CLASSES, key=lambda c: float(r[f"p_{c}"])) == r["label"] for r in rows])
    chance = max(np.unique([r["label"] for r in rows], return_counts=True)[1]) / len(rows)
    assert accuracy < chance + 0.2 * (1 - chance)  # near chance indeed
    page = (audited["out"] / "report.html").read_text()
    assert f"Warning: the fold models are near chance (out-of-fold accuracy {accuracy:.3f}" in page
    assert "Warning: the fold models are near chance" in audited["stdout"]


@pytest.mark.slow
def test_names_that_a_spreadsheet_would_evaluate_are_written_as_text(
    shapes_root: Path, tmp_path: Path, workdir: Path
) -> None:
    formula = '=HYPERLINK("evil.example","x")'
    data = tmp_path / "data"
    for name, source in ((formula, "circle"), ("plain", "square")):
        shutil.copytree(shapes_root / "train" / source, data / name)
    os.rename(data / "plain" / "00000.jpg", data / "plain" / "=1+2.jpg")
    assert run_audit(f"--data.root={data}", *TINY, "--name=f") == 0
    rows = read(workdir / "logs" / "f" / "audit" / "oof_probabilities.csv")
    cells = {(r["file"], r["label"]) for r in rows}
    assert (f"'{formula}/00000.jpg", f"'{formula}") in cells
    assert ("plain/=1+2.jpg", "plain") in cells
    assert not any(v.startswith(("=", "+", "-", "@")) for r in rows for v in r.values())


@pytest.mark.slow
def test_the_audit_says_how_long_it_will_take_before_training(audited: dict) -> None:
    """74 readable images, 2 folds of 37: the plan and its estimate from a measured step, before training."""
    lines = audited["stdout"].splitlines()
    plan = next(i for i, line in enumerate(lines) if line.startswith("Training 2 folds x 1 epoch on 37 "))
    assert lines[plan - 1] == "Timing a few training steps..."
    assert re.fullmatch(
        r"Training 2 folds x 1 epoch on 37 images each: about \d+ (s|min) \(until \d\d:\d\d; measured "
        r"\d+\.\d\d s per batch of 16 on the CPU\)\.",
        lines[plan],
    )
    assert lines[plan + 1].startswith("Audited 74 images")


def recipe(batch_size: int = 32) -> Recipe:
    return Recipe({}, epochs=0, batch_size=batch_size, num_workers=0, seed=0, progress=False)


def test_the_estimate_counts_steps_epochs_folds_and_prediction() -> None:
    step = StepTime(0.5, 32, on_cpu=False, epoch_start=1.0, fold_start=4.0)
    plan = plan_folds(step, 5, None, 10, 320, 400, recipe())  # 5 folds of 320 (of 400), the rule's 10 epochs
    assert plan.epochs == 10  # an accelerator keeps the rule
    # per fold: start 4 s + 10 epochs x (1 s + 10 batches x 0.5 s) + predicting 13 batches (1 + 13 x 0.5 / 3)
    assert plan.seconds() == pytest.approx(5 * (4 + 10 * (1 + 5) + 1 + 13 * 0.5 / 3))
    text = plan.describe(now=datetime(2026, 1, 1, 12, 0))
    assert text == (
        "Training 5 folds x 10 epochs on 320 images each: about 6 min (until 12:05; measured 0.50 s per "
        "batch of 32 on the accelerator)."
    )


def test_on_a_cpu_the_default_folds_and_epochs_fit_the_budget_and_given_values_are_kept() -> None:
    assert (default_folds(on_cpu=True), default_folds(on_cpu=False)) == (3, 5)
    slow = StepTime(2.0, 32, on_cpu=True, epoch_start=1.0, fold_start=5.0)  # 3 batches an epoch: 7 s
    plan = plan_folds(slow, 3, None, 15, 100, 150, recipe())  # 3 folds of 100 (of 150), the rule's 15 epochs
    assert plan.epochs == 12 and plan.seconds() <= CPU_BUDGET_S < plan.seconds() + 3 * 7  # one more: over
    text = plan.describe()
    assert "On a CPU the default is 12 epochs instead of 15, to stay near 5 min; --epochs=15 trains" in text
    given = plan_folds(slow, 3, 15, 15, 100, 150, recipe())
    assert given.epochs == 15 and "instead of" not in given.describe()
    fast = StepTime(0.1, 32, on_cpu=True)
    assert plan_folds(fast, 3, None, 15, 100, 150, recipe()).epochs == 15  # fits: the rule's epochs
    huge = plan_folds(slow, 3, None, 15, 2867, 4300, recipe())  # thousands of photos on a slow CPU
    assert huge.epochs == 3  # never below the rule's minimum: the models would learn nothing
    text = huge.describe()
    assert "about 32 min" in text and "Shorter: --folds=2, a smaller --data.image_size" in text


@pytest.mark.slow
def test_the_first_ctrl_c_stops_the_audit_at_once_leaving_nothing_half_written(
    audited: dict, tmp_path: Path
) -> None:
    """SIGINT to the process group (as a terminal sends it) while the folds train with 2 loader workers."""
    data, keep = audited["data"], tmp_path / "keep.txt"
    args = [f"--data.root={data}", *TINY, "--epochs=500", "--data.num_workers=2", "--name=s"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "project", "audit", *args, f"--write_clean={keep}"]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    assert process.stdout is not None
    for line in process.stdout:  # the folds have started training
        if line.startswith(b"Training 2 folds x 500 epochs"):
            break
    time.sleep(1.0)
    os.killpg(process.pid, signal.SIGINT)
    signalled = time.monotonic()
    out, err = process.communicate(timeout=60)
    assert time.monotonic() - signalled < 10, "the first Ctrl-C did not stop the audit promptly"
    assert process.returncode == 130, err.decode()
    assert err.decode().strip().splitlines()[-1].startswith("Stopped by Ctrl-C. Nothing is half-written")
    assert b"Traceback" not in err + out
    run = tmp_path / "logs" / "s"
    assert [p.name for p in run.iterdir()] == [".lock"]  # no audit/, no hidden staging folder
    assert not keep.exists() and list(tmp_path.glob(".keep.txt*")) == []
    assert fingerprint(data) == audited["before"]


def test_a_ctrl_c_inside_a_del_is_kept_for_the_next_safe_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Raised in a `__del__` (a loader iterator collected between epochs), Python prints and drops it."""
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    class Collected:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between these bytecodes
                pass

    with stop_on_ctrl_c():
        Collected()  # collected at once, its __del__ signals
        assert unraisable == []
        with pytest.raises(Stopped):
            raise_if_stopped()
        with pytest.raises(Stopped):  # outside a __del__ the handler raises at once
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass


def test_a_ctrl_c_while_a_worker_hands_over_a_file_is_kept_for_the_next_safe_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Raised while a loader worker hands a batch's file descriptor over (multiprocessing's resource sharer,
    as torch's `rebuild_storage_fd` uses it), the handshake breaks and the worker's end prints a traceback."""
    from multiprocessing import reduction, resource_sharer

    receive = reduction.recv_handle

    def signalled(conn: object) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs between these bytecodes
            pass
        return receive(conn)

    monkeypatch.setattr(reduction, "recv_handle", signalled)
    read, write = os.pipe()
    with stop_on_ctrl_c():
        handed = resource_sharer.DupFd(write).detach()  # the handover is not broken off
        os.write(handed, b"x")
        assert os.read(read, 1) == b"x"
        with pytest.raises(Stopped):
            raise_if_stopped()
    for fd in (read, write, handed):
        os.close(fd)


def test_a_ctrl_c_in_a_fork_hook_is_kept_for_the_next_safe_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Raised in logging's at-fork hook (a loader worker starting), Python prints and drops it."""
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    parent = os.getpid()

    class SignallingLock:  # logging's module lock, signalled while its after-fork hook releases it
        def __init__(self, lock: object) -> None:
            self.lock, self.armed = lock, False

        def __getattr__(self, name: str) -> object:
            return getattr(self.lock, name)

        def release(self) -> None:
            if self.armed and os.getpid() == parent:
                self.armed = False
                os.kill(parent, signal.SIGINT)
                for _ in range(1000):  # the handler runs between these bytecodes
                    pass
            self.lock.release()

    lock = SignallingLock(logging._lock)
    monkeypatch.setattr(logging, "_lock", lock)
    with stop_on_ctrl_c():
        lock.armed = True
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        assert unraisable == []
        with pytest.raises(Stopped):
            raise_if_stopped()
    assert not lock.armed and repr(lock.lock).startswith("<unlocked")  # signalled, and logging's lock is free
