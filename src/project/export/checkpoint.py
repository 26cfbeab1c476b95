"""Export a checkpoint to its targets (ONNX, .pt2, OpenVINO), verified before it is kept, with a JSON sidecar.

Each file takes a uint8 RGB batch [N, 3, H, W] at the trained size (preprocessing is baked in) and
returns logits. The steps: read the checkpoint (`read`), write each target under a temporary name
next to it and verify it against the PyTorch model in eval mode (`write_verified`), describe the
export in the sidecar (`describe`), rename everything into place, and repoint the `latest.*` links
atomically (`publish`).
The sidecar's temperature is fitted on the validation images (`calibration`).  # room: calibration
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import project
from project.atomic import atomic_files, atomic_symlink
from project.backbones import feature_layer
from project.checkpoint_io import load_checkpoint_file
from project.data.datamodule import DEFAULT_INTERPOLATION
from project.data.transforms import MODES, Interpolation

# room: unknown begin
from project.deploy import feature_bank

# room: unknown end
from project.deploy.sidecar import Sidecar, version_for
from project.errors import UserError
from project.export.deployable import Deployable, export_program, load_for_export

# room: calibration begin
from project.export.fit_calibration import Fitted, calibrate_export
from project.export.fit_calibration import skipped as calibration_skipped

# room: calibration end
from project.export.options import ExportOptions
from project.export.targets import Files, Source, Target, chosen
from project.export.verify import ExportError, compare, load, verification_batches
from project.metrics import MONITOR
from project.model import ImageClassifier

FEATURES_MEANING = "penultimate features (the classification layer's input)"  # the second output's
FEATURES_MEANING += ", for the knn unknown score"  # room: unknown


@dataclass(frozen=True)
class Exported:
    """What an export wrote: each target's main file (by name), the sidecar, and what the sidecar holds."""

    files: dict[str, Path]
    sidecar: Path
    metadata: dict

    # room: openvino begin
    @property
    def openvino(self) -> Path | None:
        """The IR's .xml, with `--format openvino`."""
        return self.files.get("openvino")

    # room: openvino end

    @property
    def onnx(self) -> Path:
        return self.files["onnx"]

    @property
    def pt2(self) -> Path:
        return self.files["pt2"]


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read for export.

    Args:
        path: The checkpoint file (resolved).
        contents: What torch.load read from it.
        model: Its classifier, weights loaded, eval mode, CPU.
    """

    path: Path
    contents: dict
    model: ImageClassifier

    @property
    def size(self) -> int:
        return self.model.image_size or 224

    # room: recipes begin
    @property
    def tta(self) -> str:
        """The test-time augmentation its run validated with, and so scored its checkpoints with."""
        return str(self.contents.get("hyper_parameters", {}).get("tta", "none"))

    # room: recipes end
    @property
    def crop_ratio(self) -> float:
        return self.contents.get("datamodule_hyper_parameters", {}).get("crop_ratio", 0.875)

    @property
    def interpolation(self) -> Interpolation:
        """The run's resize filter (checkpoints from before the option: bilinear, the one there was)."""
        value = self.contents.get("datamodule_hyper_parameters", {}).get(
            "interpolation", DEFAULT_INTERPOLATION
        )
        if value not in MODES:
            raise UserError(
                f"Checkpoint '{self.path}' names the resize filter {value!r} "
                "(datamodule_hyper_parameters.interpolation): it must be bilinear or bicubic.",
                "export a checkpoint written by `fit`, or correct that value.",
            )
        return value

    @property
    def run(self) -> str:
        return self.path.parent.name

    def monitored(self) -> tuple[str, float | None]:
        """The metric its ModelCheckpoint monitored and the checkpoint's score (None when unknown)."""
        for key, state in self.contents.get("callbacks", {}).items():
            if key.startswith("ModelCheckpoint") and state.get("current_score") is not None:
                return state["monitor"], float(state["current_score"])
        return MONITOR, None


def export_checkpoint(
    ckpt_path: str | Path,
    images: Sequence[Path] = (),
    output_dir: str | Path | None = None,
    datamodule: object = None,
    **options: Any,
) -> Exported:
    """Export `ckpt_path` next to it (or into `output_dir`); verify on random and real images.

    `options` are the fields of ExportOptions (checked there).
    # room: calibration begin
    With `datamodule` (its validation images on disk) the sidecar also gets a temperature
    (`project.export.fit_calibration`)
    # room: calibration end
    and an unknown threshold accepting the share `unknown_accept` (0 or None: off)  # room: unknown
    of validation images (`fit_unknown`);  # room: unknown
    `quantize="int8"` also writes `<stem>-int8.onnx` (`quantize.py`);  # room: int8
    `format=NAME` also writes the optional target NAME of project.export.targets (an OpenVINO IR:
    `<stem>.xml` + `.bin`).
    """
    settings = ExportOptions(**options)
    targets = chosen(settings.format)
    for target in targets:
        if target.require is not None:
            target.require()  # before any work: a missing package is one message
    checkpoint = read(ckpt_path)
    deployable = Deployable(checkpoint.model).eval()
    metrics = export_metrics(checkpoint, deployable, datamodule)
    fitted = calibration(checkpoint, deployable, datamodule, settings)  # room: calibration
    extra: list[str] = []  # files beside the model's
    if fitted.bank is not None:  # room: unknown
        extra.append(feature_bank.SUFFIX)  # room: unknown
    final = final_paths(checkpoint, output_dir, targets, metrics, tuple(extra))
    source = Source(deployable, export_program(deployable, checkpoint.size), checkpoint.size, settings.opset)
    batches = verification_batches(checkpoint.size, checkpoint.crop_ratio, images, checkpoint.interpolation)
    # renamed into place together once verified, in this order: the sidecar appears last
    with atomic_files(*final.values()) as partials:
        partial = dict(zip(final, partials, strict=True))
        exporters, verification = write_verified(source, partial, batches, targets)
        metadata = describe(checkpoint, settings.opset, verification, deployable) | exporters
        metadata |= {"metrics": metrics}
        metadata |= fitted.keys  # room: calibration
        metadata["version"] = version_for(
            checkpoint.interpolation,
            metadata.get("unknown_score"),  # room: unknown
        )
        metadata["versions"] |= {t.name: t.version() for t in targets if t.version is not None}
        metadata["files"] = {target.name: final[target.main].name for target in targets}
        # room: unknown begin
        if fitted.bank is not None:
            data = fitted.bank.to_bytes()
            partial[feature_bank.SUFFIX].write_bytes(data)
            metadata["feature_bank"] = feature_bank.describe(
                fitted.bank, final[feature_bank.SUFFIX].name, data
            )
        # room: unknown end
        # checked as every reader checks it: a value no reader would take fails here, not there
        sidecar = Sidecar.from_dict(metadata, final["json"])
        partial["json"].write_text(sidecar.to_json())
    publish(final)
    # room: int8 begin
    if settings.quantize == "int8":  # `<stem>-int8.onnx` beside the float model, measured against it
        from project.export.quantize import quantize_export

        quantize_export(final["onnx"], datamodule)
    # room: int8 end
    files = {target.name: final[target.main] for target in targets}
    return Exported(files, final["json"], sidecar.to_dict())


def read(ckpt_path: str | Path) -> Checkpoint:
    """The checkpoint at `ckpt_path` with its model; UserError when there is no such file."""
    path = Path(ckpt_path).resolve()
    if not path.is_file():
        raise UserError(f"Checkpoint '{path}' does not exist.", "pass --ckpt_path PATH to a .ckpt file.")
    contents = load_checkpoint_file(path)
    return Checkpoint(path, contents, load_for_export(contents))


def export_metrics(checkpoint: Checkpoint, model: nn.Module, datamodule: object) -> dict:
    """The sidecar's `metrics`, its first key the figure the file name states: the checkpoint's score.
    # room: recipes begin

    A run with test-time augmentation scored its checkpoints with it, which exports leave out: then the
    first key is the export's own validation accuracy (left out without validation images), and the
    checkpoint's score follows as `<metric>_with_tta_<tta>`.
    # room: recipes end
    """
    monitor, score = checkpoint.monitored()
    steps = {"epoch": checkpoint.contents.get("epoch"), "global_step": checkpoint.contents.get("global_step")}
    # room: recipes begin
    if checkpoint.tta != "none":
        own = export_accuracy(checkpoint, model, datamodule)
        return {**own, f"{monitor}_with_tta_{checkpoint.tta}": score, **steps}
    # room: recipes end
    return {monitor: score, **steps}


# room: recipes begin
def export_accuracy(checkpoint: Checkpoint, model: nn.Module, datamodule: object) -> dict:
    """{"val/acc": top-1 accuracy of `model` on the validation images, "val/acc_images": how many}, or {}."""
    from project.export.validation import collect_logits, validation_loader

    # room: multilabel begin
    if checkpoint.model.multilabel:
        return {}
    # room: multilabel end
    try:
        loader = validation_loader(
            datamodule, checkpoint.size, checkpoint.crop_ratio, interpolation=checkpoint.interpolation
        )
    except ValueError:  # no validation images here: the export states no accuracy rather than another's
        return {}
    logits, labels = collect_logits(model, loader)
    if len(labels) == 0:
        return {}
    return {"val/acc": float((logits.argmax(1) == labels).double().mean()), "val/acc_images": len(labels)}


# room: recipes end
def final_paths(
    checkpoint: Checkpoint,
    output_dir: str | Path | None,
    targets: list[Target],
    metrics: dict,
    extra: tuple[str, ...] = (),
) -> dict[str, Path]:
    """Where the targets' files, the `extra` ones beside them and the sidecar (`json`, last) go, by
    suffix: `<run>-<metric>=<score>-<time>.<suffix>`, the first of `metrics` (export_metrics) when it is
    the export's own."""
    monitor, score = next(iter(metrics.items()))
    # room: recipes begin
    if "_with_tta_" in monitor:
        score = None  # the checkpoint's score with TTA, which the export does not have: no figure in the name
    # room: recipes end
    stamp = time.strftime("%Y%m%d-%H%M%S")
    metric = f"-{monitor.replace('/', '_')}={score:.4f}" if score is not None else ""
    out = Path(output_dir) if output_dir is not None else checkpoint.path.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{checkpoint.run}{metric}-{stamp}"
    suffixes = [suffix for target in targets for suffix in target.files]
    return {suffix: out / f"{stem}.{suffix}" for suffix in (*suffixes, *extra, "json")}


def write_verified(
    source: Source, paths: dict[str, Path], batches: dict[str, torch.Tensor], targets: list[Target]
) -> tuple[dict[str, str], dict]:
    """Write each target's files at `paths` (by suffix), verified; returns the exporters used and the
    verification."""
    exporters: dict[str, str] = {}
    results: dict[str, dict] = {}
    report: dict = {}
    for target in targets:
        files = {suffix: paths[suffix] for suffix in target.files}
        writer, report = _write_one(target, source, files, batches)
        source.files[target.name] = files[target.main]
        results.update(report["results"])
        if len(target.writers) > 1:  # which of them wrote it: worth knowing only where there was a choice
            exporters[f"{target.name}_exporter"] = writer
    return exporters, {**report, "results": results}


def _write_one(
    target: Target, source: Source, files: Files, batches: dict[str, torch.Tensor]
) -> tuple[str, dict]:
    """The first of `target`'s writers whose files pass verification, and its report; else ExportError."""
    names = list(target.writers)
    for name in names:
        if not target.writers[name](source, files):
            continue  # cannot write this model: the next writer
        try:
            return name, compare(source.model, {target.name: load(target.name, files)}, batches)
        except ExportError:
            if name == names[-1]:
                raise
    raise ExportError(f"No exporter could write the {target.name} file.", "try another --opset.")


# room: calibration begin
def calibration(
    checkpoint: Checkpoint, model: nn.Module, datamodule: object, settings: ExportOptions
) -> Fitted:
    """The sidecar's calibration keys, fitted on `datamodule`'s images, or why not.

    And the feature bank the unknown score reads, if any.  # room: unknown
    """
    if not settings.calibrate:
        return Fitted(calibration_skipped("turned off (calibrate=false)"))
    return calibrate_export(
        model,
        datamodule,
        checkpoint.size,
        checkpoint.crop_ratio,
        checkpoint.interpolation,
        multilabel=checkpoint.model.multilabel,  # room: multilabel
        # room: unknown begin
        accept=settings.unknown_accept,
        score_name=settings.unknown_score,
        class_names=checkpoint.model.label_names,
        # room: unknown end
    )


# room: calibration end
def describe(checkpoint: Checkpoint, opset: int, verification: dict, deployable: Deployable) -> dict:
    """The sidecar's description of the export: the model's interface, preprocessing, origin and versions."""
    import onnx
    import onnxruntime

    model, size, crop_ratio = checkpoint.model, checkpoint.size, checkpoint.crop_ratio
    hp = checkpoint.contents["hyper_parameters"]
    return {
        "class_names": model.label_names,
        "image_size": size,
        "task": "multiclass",
        # room: multilabel begin
        **({"task": model.task, "threshold": model.threshold} if model.multilabel else {}),
        # room: multilabel end
        "input": {"name": "images", "shape": ["N", 3, size, size], "dtype": "uint8", "layout": "NCHW, RGB"},
        "output": {
            "name": "logits",
            "shape": ["N", hp["num_classes"]],
            "meaning": "logits (softmax for probabilities)",
            # room: multilabel begin
            **({"meaning": "logits (a sigmoid per label for probabilities)"} if model.multilabel else {}),
            # room: multilabel end
        },
        **(
            {
                "features_output": {
                    "name": "features",
                    "shape": ["N", feature_layer(model.net).in_features],
                    "meaning": FEATURES_MEANING,
                }
            }
            if deployable.features
            else {}
        ),
        "preprocessing": {
            "resize": f"short side to round(image_size / crop_ratio) = {round(size / crop_ratio)}, "
            f"{checkpoint.interpolation}, antialiased",
            "interpolation": checkpoint.interpolation,
            "crop": f"centre crop {size}x{size}",
            "crop_ratio": crop_ratio,
            "normalization": {"mean": list(hp["mean"]), "std": list(hp["std"]), "baked_in": True},
        },
        "source_checkpoint": {"path": str(checkpoint.path), "sha256": _sha256(checkpoint.path)},
        "backbone": hp["backbone"],
        # what the backbone's pretrained weights expect (timm: its pretrained config), for reference
        "pretrained_config": dict(model.pretrained_config),
        "run": checkpoint.run,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": {
            "project": project.__version__,
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
        "opset": opset,
        "verification": verification,
    }


def publish(final: dict[str, Path]) -> None:
    """Repoint each `latest.<suffix>` link at the new file, the sidecar's last."""
    for suffix, path in final.items():
        atomic_symlink(path.with_name(f"latest.{suffix}"), path.name)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
