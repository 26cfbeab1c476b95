"""The optional rooms of the template: parts a new task can leave out whole (`new DEST --without ROOM`).

A room owns its files (source, tests, docs, benchmarks, configs: glob patterns from the checkout's root;
a file of two rooms goes with either), the extras of pyproject.toml its packages come from, and its
commands (their rows in __main__.COMMANDS or __main__.TRAINING). A room that uses another `needs` it,
and goes with it. Whatever belongs to no room is the core: fit, validate, test, predict, the ONNX and
`.pt2` export, infer and the callbacks that guard a run.

Lines that belong to a room inside a shared file (a README row, a dispatch row, a test's row, an extra)
carry a marker in that file's comment syntax, and go with the room:

    "name": ("project.name.command", "what it does", "extra"),  # room: ROOM
    | `name` | what it does | [its page](docs/name.md) | <!-- room: ROOM -->

(ROOM being the room's name, in lower case), and a block of lines sits between `room: ROOM begin` and
`room: ROOM end` marker lines. The rules that keep rooms apart (no core import of a room, no room
reaching into another, every marker naming a room, nothing left behind in a clone) are
tests/test_rooms.py.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass


@dataclass(frozen=True)
class Room:
    """An optional part of the template: what it is for, and everything that goes with it."""

    summary: str
    files: tuple[str, ...]  # glob patterns (fnmatch, from the checkout's root; `*` crosses folders)
    extras: tuple[str, ...] = ()  # pyproject.toml's optional-dependencies that only this room uses
    commands: tuple[str, ...] = ()  # rows of __main__.COMMANDS or __main__.TRAINING
    needs: tuple[str, ...] = ()  # rooms whose code this one uses: leaving one of them out leaves this one out

    def owns(self, path: str) -> bool:
        """Whether `path` (relative to the checkout's root, with /) is one of this room's files."""
        return any(fnmatch.fnmatch(path, pattern) for pattern in self.files)


ROOMS = {
    # room: serve begin
    "serve": Room(
        "an HTTP service for an export (FastAPI on uvicorn), its page, and the torch-free serving image",
        files=(
            "src/project/deploy/serve/*",
            "deploy/*",
            "src/project/template/deploy",
            "tests/test_serve.py",
            "tests/test_serve_page.py",
            "tests/test_deploy_install.py",
            "tests/servers.py",
            "docs/serve.md",
            "docs/deploy.md",
            "docs/images/serve-page.png",
            "bench/serve_load.py",
        ),
        extras=("serve",),
        commands=("serve",),
    ),
    # room: serve end
    # room: sweep begin
    "sweep": Room(
        "hyperparameter searches over fit's own options with Optuna (resumable, pruned, parallel)",
        files=("src/project/sweep/*", "tests/test_sweep.py", "docs/sweep.md", "configs/sweeps/*"),
        extras=("sweep", "postgres"),
        commands=("sweep",),
        needs=("pictures",),  # --summary's pictures: matplotlib, drawn as figures.py draws
    ),
    # room: sweep end
    # room: audit begin
    "audit": Room(
        "a data set's wrong labels, duplicates, leaks and outliers (cleanlab, cross-validated folds)",
        files=(
            "src/project/audit/*",
            "tests/test_audit.py",
            "docs/audit.md",
            "docs/audit-data-set.md",
            "bench/audit_quality.py",
        ),
        extras=("audit",),
        commands=("audit",),
    ),
    # room: audit end
    # room: doctor begin
    "doctor": Room(
        "`doctor`: this machine checked before a run (versions, CUDA, devices, loader workers, disk)",
        files=("src/project/doctor.py", "tests/test_doctor.py"),
        commands=("doctor",),
    ),
    # room: doctor end
    # room: explain begin
    "explain": Room(
        "Grad-CAM overlays of predict's images (`--explain.dir`), for error analysis (pytorch-grad-cam)",
        files=("src/project/explain.py", "src/project/callbacks/grad_cam.py"),
        extras=("explain",),
    ),
    # room: explain end
    # room: api begin
    "api": Room(
        "the Python API (`project.api`): fit, predict and the other commands from Python, as the commands do",
        files=("src/project/api.py", "tests/test_api.py", "docs/python.md"),
    ),
    # room: api end
    # room: report begin
    "report": Room(
        "`report`: a run's curves, confusion matrix and reliability diagram as PNG + HTML, no TensorBoard",
        files=(
            "src/project/report.py",
            "tests/test_report.py",
            "docs/images/report.png",
            "docs/images/report-page.png",
        ),
        commands=("report",),
        needs=("pictures",),  # it draws with figures.py, on matplotlib
    ),
    # room: report end
    # room: notebooks begin
    "notebooks": Room(
        "two Jupyter notebooks on the Python API (a quickstart, your own images), run by the tests",
        files=("notebooks/*", "src/project/template/notebooks", "tests/test_notebooks.py"),
        needs=("api", "report"),
    ),
    # room: notebooks end
    # room: tuning begin
    "tuning": Room(
        "`lr_find` and `batch_size_find`: a suggested learning rate, the largest batch that fits (Tuner)",
        files=("src/project/tuning.py", "tests/test_tuning.py"),
        commands=("lr_find", "batch_size_find"),
        needs=("pictures",),  # lr_find's plot: matplotlib, drawn as figures.py draws
    ),
    # room: tuning end
    # room: memory begin
    "memory": Room(
        "`memory`: the memory budget of one real training step, and what would shrink it",
        files=("src/project/memory_budget.py", "tests/test_memory_budget.py"),
        commands=("memory",),
    ),
    # room: memory end
    # room: pictures begin
    "pictures": Room(
        "TensorBoard's pictures of a run (training images, confusion matrix, misclassified) and `show_batch`",
        files=(
            "src/project/figures.py",
            "src/project/show_batch.py",
            "src/project/callbacks/pictures.py",
            "src/project/callbacks/training_images.py",
            "src/project/callbacks/confusion_matrix.py",
            "src/project/callbacks/misclassified.py",
            "tests/test_figures.py",
        ),
        commands=("show_batch",),
    ),
    # room: pictures end
    # room: openvino begin
    "openvino": Room(
        "`export --format openvino`: an OpenVINO IR beside the ONNX file, verified, run by infer and serve",
        files=(
            "src/project/export/openvino_target.py",
            "src/project/deploy/openvino_runtime.py",
            "tests/test_openvino_runtime.py",
            "docs/openvino.md",
            "bench/openvino_latency.py",
        ),
        extras=("openvino",),
    ),
    # room: openvino end
    # room: int8 begin
    "int8": Room(
        "`export --quantize int8`: an int8 ONNX model beside the float one, measured against it",
        files=("src/project/export/quantize.py", "tests/test_int8.py"),
    ),
    # room: int8 end
    # room: ema begin
    "ema": Room(
        "`--ema.decay`: an EMA of the weights, which validation, checkpoints and exports then use",
        files=("src/project/callbacks/ema.py", "tests/test_ema.py"),
    ),
    # room: ema end
    # room: models begin
    "models": Room(
        "`models`: the backbones --model.backbone takes, by pattern, with their weights and preprocessing",
        files=("src/project/models.py", "tests/test_models.py"),
        commands=("models",),
    ),
    # room: models end
    # room: dashboard begin
    "dashboard": Room(
        "TensorBoard's views past the scalars: images/s and epoch time (in the bar too), hparams, a layout",
        files=(
            "src/project/callbacks/throughput.py",
            "src/project/callbacks/hparams.py",
            "src/project/callbacks/scalars_layout.py",
            "tests/test_throughput.py",
        ),
    ),
    # room: dashboard end
    # room: finetune begin
    "finetune": Room(
        "the fine-tuning schedule: head-only epochs, then layer-decayed learning rates (--model.head_epochs)",
        files=("src/project/finetune.py", "tests/test_finetune.py"),
    ),
    # room: finetune end
    # room: console begin
    "console": Room(
        "a quiet console: Lightning's unhelpful messages dropped, no FLOPs column, per-epoch lines in a log",
        files=("src/project/callbacks/epoch_lines.py", "src/project/callbacks/model_summary.py"),
    ),
    # room: console end
    # room: multilabel begin
    "multilabel": Room(
        "multi-label classification (`--data.labels_csv`): a sigmoid per label, per-label metrics, threshold",
        files=(
            "src/project/data/labels_csv.py",
            "src/project/data/multishapes.py",
            "tests/test_multilabel.py",
            "configs/experiments/multilabel.yaml",
        ),
    ),
    # room: multilabel end
    # room: recipes begin
    "recipes": Room(
        "training recipes beyond the plain one: MixUp/CutMix, class balancing, test-time augmentation (flip)",
        files=("tests/test_mix.py", "tests/test_balance.py", "bench/imbalance_mix.py"),
    ),
    # room: recipes end
    # room: timm begin
    "timm": Room(
        "timm's models as backbones (`--model.backbone=timm/<name>`), weights from the Hugging Face hub",
        files=(
            "src/project/timm_backbones.py",
            "src/project/sync_batchnorm.py",  # --trainer.sync_batchnorm that keeps timm's layers whole
            "tests/test_timm_backbones.py",
            "docs/timm.md",
        ),
        extras=("timm",),
    ),
    # room: timm end
    # room: trackers begin
    "trackers": Room(
        "MLflow, W&B and CSV beside TensorBoard (`--config configs/presets/mlflow.yaml`): runs, files, links",
        files=(
            "src/project/trackers.py",
            "src/project/callbacks/trackers.py",
            "tests/test_trackers.py",
            "configs/presets/mlflow.yaml",
            "configs/presets/wandb.yaml",
            "configs/presets/csv.yaml",
        ),
        extras=("trackers",),
    ),
    # room: trackers end
    # room: shards begin
    "shards": Room(
        "`optimize`: a data set as LitData shards, streamed by fit from a folder or a bucket (s3://)",
        files=(
            "src/project/optimize.py",
            "src/project/data/shards.py",
            "src/project/data/shard_sample.py",
            "src/project/data/shard_checks.py",
            "src/project/data/streaming.py",
            "tests/test_shards*.py",
            "tests/shard_files.py",
            "docs/shards.md",
            "bench/shard*.py",
        ),
        extras=("shards",),
        commands=("optimize",),
    ),
    # room: shards end
    # room: cache begin
    "cache": Room(
        "`--data.cache`: small images decoded once into memory, and augmented a batch at a time there",
        files=(
            "src/project/data/cache.py",
            "src/project/data/batch_augment.py",
            "tests/test_cache.py",
            "tests/test_batch_augment.py",
            "bench/cache_epoch.py",
            "bench/calibration_pass.py",  # room: calibration
        ),
    ),
    # room: cache end
    # room: unknown begin
    "unknown": Room(
        "the `unknown` answer for foreign images: a score (knn, energy, max_probability) and its threshold",
        files=(
            "src/project/deploy/unknown.py",
            "src/project/deploy/feature_bank.py",
            "src/project/export/fit_unknown.py",
            "src/project/export/foreign.py",
            "tests/test_unknown.py",
            "bench/unknown.py",
        ),
        needs=("calibration",),  # its scores read the temperature (deploy/calibration.py applies both)
    ),
    # room: unknown end
    # room: calibration begin
    "calibration": Room(
        "temperature scaling: a temperature fitted on validation at export, applied by predict, infer, serve",
        files=(
            "src/project/export/fit_calibration.py",
            "src/project/deploy/calibration.py",
            "bench/calibration_pass.py",  # room: cache
        ),
    ),
    # room: calibration end
    # room: new begin
    "new": Room(
        "`new` itself: making copies like this one (a task made from the template needs it no more)",
        files=(
            "src/project/new.py",
            "src/project/rooms.py",
            "src/project/template/*",
            "tests/test_new.py",
            "tests/test_rooms.py",
        ),
        commands=("new",),
    ),
    # room: new end
}

# `room: NAME` in a comment marks a line (`room: NAME, OTHER`: a line that goes with either room);
# `room: NAME begin` ... `room: NAME end` a block of lines
NAME = r"[a-z][a-z0-9_]*"  # a room's name: lower-case letters, digits and _, a letter first
MARKER = re.compile(rf"(?:#|<!--)\s*room:\s*(?P<name>{NAME}(?:,\s*{NAME})*)(?:\s+(?P<edge>begin|end))?\b")


def rooms_of(path: str) -> frozenset[str]:
    """The rooms a file belongs to (it goes with any of them); none for the core."""
    return frozenset(name for name, room in ROOMS.items() if room.owns(path))


def with_dependents(left_out: AbstractSet[str]) -> frozenset[str]:
    """`left_out` and every room that needs one of them, directly or through another."""
    gone = set(left_out)
    while dependents := {name for name, room in ROOMS.items() if set(room.needs) & gone} - gone:
        gone |= dependents
    return frozenset(gone)


def marked_rooms(found: re.Match[str]) -> list[str]:
    """The rooms a MARKER match names."""
    return [name.strip() for name in found["name"].split(",")]


def without(text: str, left_out: AbstractSet[str]) -> str:
    """`text` less the lines marked for the rooms in `left_out` (each marker line of a block goes too).

    Raises:
        ValueError: A block's `end` that closes no open block of its room, or a `begin` never closed
            (which would take the rest of the file with it).
    """
    kept, inside = [], []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        found = MARKER.search(line)
        names, edge = (marked_rooms(found), found["edge"]) if found else ([], None)
        if edge == "begin":
            inside.append(names[0])
        skip = any(n in left_out for n in inside) or any(n in left_out for n in names)
        if edge == "end":
            if not inside or inside[-1] != names[0]:
                raise ValueError(f"line {number}: `room: {names[0]} end` closes no `room: {names[0]} begin`")
            inside.pop()
        if not skip:
            kept.append(line)
    if inside:
        raise ValueError(f"`room: {inside[-1]} begin` is never closed by `room: {inside[-1]} end`")
    return "".join(kept)
