"""Every kind of troublesome file in tests/bad_files.py is loaded, ignored or reported, as its case says."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from project.data.decode import BadImageError, load_rgb
from project.data.index import list_images
from tests.bad_files import CASES, Case, make_corpus
from tests.helpers import fast_args, run_cli


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    make_corpus(folder)
    return folder


def test_the_corpus_has_every_kind_the_issue_names() -> None:
    assert len(CASES) >= 16
    assert len({case.kind for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.kind for case in CASES])
def test_each_kind_of_file(corpus: Path, case: Case) -> None:
    indexed = {os.fsencode(name) for name in list_images(corpus)}
    name = case.name if isinstance(case.name, bytes) else case.name.encode()
    if case.outcome == "ignored":
        assert name not in indexed
        return
    assert name in indexed
    if case.outcome == "load":
        assert "x".join(map(str, load_rgb(case.path(corpus)).shape)) == case.detail
    elif case.kind.startswith("unreadable") and os.geteuid() == 0:
        assert _load_as_nobody(case.path(corpus)).lower().startswith(case.detail)  # root reads anything
    else:
        with pytest.raises(BadImageError, match=r"Cannot decode image '.*'.*skip_bad_images") as caught:
            load_rgb(case.path(corpus))
        assert case.detail in caught.value.reason.lower()


def _load_as_nobody(path: Path) -> str:
    """load_rgb's error reason in a forked child that dropped root's right to read every file."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest, no cleanup, just the answer
        os.close(read)
        try:
            os.setuid(65534)
            load_rgb(path)
            answer = "loaded"
        except BadImageError as e:
            answer = e.reason
        except BaseException as e:
            answer = repr(e)
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        return f.read().decode()


@pytest.mark.slow
def test_training_skips_bad_files_and_lists_them_in_the_run_folder(workdir: Path, shapes_root: Path) -> None:
    root = workdir / "data"
    shutil.copytree(shapes_root, root)
    cases = make_corpus(root / "train" / "circle")
    shutil.copy(root / "train" / "circle" / "empty.jpg", root / "val" / "square" / "empty.jpg")
    # one batch larger than the split: no file is left out by drop_last, so every bad one is met
    args = fast_args(
        root, "--name=skip", "--data.skip_bad_images=true", "--data.num_workers=2", "--data.batch_size=128"
    )
    assert run_cli("fit", *args) == 0
    listed = (workdir / "logs" / "skip" / "skipped_files.txt").read_bytes().splitlines()
    skipped = sorted(line.split(b"\t")[0] for line in listed)
    expected = [root / "train" / "circle" / os.fsdecode(c.name) for c in cases if c.outcome == "bad"]
    expected.append(root / "val" / "square" / "empty.jpg")
    if os.geteuid() == 0:
        expected.remove(root / "train" / "circle" / "locked.jpg")  # root can read it
    assert skipped == sorted(os.fsencode(p) for p in expected)
    assert all(b"\t" in line and line.split(b"\t")[1] for line in listed)  # each with its reason
    assert not list((workdir / "logs" / "skip").glob(".skipped-*"))  # the workers' parts were merged
    assert (workdir / "checkpoints" / "skip" / "last.ckpt").is_file()


def test_without_skipping_the_first_bad_file_stops_the_run_by_name(
    workdir: Path, shapes_root: Path, capsys
) -> None:
    root = workdir / "data"
    shutil.copytree(shapes_root, root)
    (root / "val" / "ring" / "zero.png").write_bytes(b"")
    assert run_cli("fit", *fast_args(root, "--name=stop")) == 2
    assert f"error: Cannot decode image '{root / 'val' / 'ring' / 'zero.png'}': the file is empty." in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_skipped_file_warnings_count_this_command_and_advise_no_flag_already_set(
    workdir: Path, shapes_root: Path, tmp_path: Path
) -> None:
    """Each command counts the files it skipped, not a list an earlier one left; a run that skips
    bad images is not told to set --data.skip_bad_images=true."""
    import warnings

    data = tmp_path / "data"
    shutil.copytree(shapes_root, data)
    (data / "val" / "circle" / "zz-bad.jpg").write_bytes(b"not an image")
    dirty, clean = tmp_path / "dirty", tmp_path / "clean"
    clean.mkdir()
    shutil.copy(next((shapes_root / "val" / "square").glob("*.jpg")), clean / "a.jpg")
    shutil.copytree(clean, dirty)
    (dirty / "bad.jpg").write_bytes(b"not an image either")
    ckpt = workdir / "checkpoints" / "skips" / "last.ckpt"
    commands = {
        "fit": fast_args(
            data, "--name=skips", "--data.skip_bad_images=true", "--trainer.limit_train_batches=1"
        ),
        "export": [f"--ckpt_path={ckpt}", "--data.num_workers=0"],
        "predict-dirty": [f"--ckpt_path={ckpt}", f"--data.predict_dir={dirty}", "--data.num_workers=0"],
        "predict-clean": [f"--ckpt_path={ckpt}", f"--data.predict_dir={clean}", "--data.num_workers=0"],
    }
    said = {}
    for name, args in commands.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert run_cli(name.split("-")[0], *args) == 0
        said[name] = [str(w.message) for w in caught]
    counts = {
        name: [m for m in messages if "unreadable files were skipped" in m] for name, messages in said.items()
    }
    assert [m.split(";")[0] for m in counts["fit"]] == ["1 unreadable files were skipped"]
    assert [m.split(";")[0] for m in counts["predict-dirty"]] == ["1 unreadable files were skipped"]
    assert counts["predict-clean"] == []  # before: 1, the fit's (or the last predict's) list
    # room: calibration begin
    # the export's calibration reads every validation image (its verification, a few)
    skipped = [m for m in said["export"] if m.startswith("Skipped a bad image")]
    assert skipped and all("zz-bad.jpg" in m for m in skipped)
    # room: calibration end
    assert not [m for messages in said.values() for m in messages if "skip_bad_images=true" in m]
