"""Export a checkpoint to ONNX and a torch.export program (.pt2), verified before it is kept.

Both take a uint8 RGB batch [N, 3, H, W] at the trained size (preprocessing is baked in) and
return logits. Files are written under temporary names next to the checkpoint, verified against
the PyTorch model in eval mode, and only then renamed; `latest.*` links are repointed atomically.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

import project
from project.atomic import atomic_files, atomic_symlink
from project.backbones import preprocessing
from project.calibrate import calibrate_export, check_accept, check_score
from project.calibrate import skipped as calibration_skipped
from project.checkpoint_io import load_checkpoint_file
from project.data.decode import BadImageError, load_rgb
from project.data.shapes import CLASSES, draw_shape
from project.data.transforms import eval_transform
from project.deploy import calibration
from project.errors import UserError
from project.model import ImageClassifier

# The max |logit difference| accepted between an exported and the PyTorch model, per batch:
# ATOL + RTOL * max |logit|. float32 rounding grows with the logits' scale: a resnet18 whose
# logits reach ~250 differs by 4.6e-4 to 1.4e-3 (a relative 5.6e-6) with nothing wrong, so a
# fixed bound refuses sound exports; a wrong weight or normalisation moves logits by far more.
ATOL, RTOL = 1e-4, 2e-5
FORMATS = ("onnx", "pt2")


class ExportError(UserError):
    """An export that failed verification: nothing was written under the final names."""


class Deployable(nn.Module):
    """uint8 images -> logits: the model's own normalization followed by the network, nothing else."""

    def __init__(self, model: ImageClassifier) -> None:
        super().__init__()
        self.normalize = model.normalize
        self.net = model.net

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(self.normalize(images))


@dataclass(frozen=True)
class Exported:
    onnx: Path
    pt2: Path
    sidecar: Path
    metadata: dict


def validation_images(datamodule: object, count: int = 7) -> list[Path]:
    """A few validation files of `datamodule` to verify exports on, or none when its data is not on disk."""
    root = getattr(datamodule, "root", None)
    if root is None or not Path(root).is_dir():
        return []
    index = datamodule.splits["val"]
    step = max(1, len(index) // count)
    picks = [index.path(i) for i in range(0, len(index), step)]
    if getattr(datamodule, "skip_bad_images", False):
        picks = [path for path in picks if _decodes(path)]  # as in training: undecodable files left out
    return picks[:count]


def _decodes(path: Path) -> bool:
    try:
        load_rgb(path)
    except BadImageError:
        return False
    return True


def load_for_export(checkpoint: dict) -> ImageClassifier:
    """The classifier of a checkpoint of this project, weights loaded, in eval mode, on the CPU."""
    hp = checkpoint["hyper_parameters"]
    model = ImageClassifier(
        num_classes=hp["num_classes"],
        class_names=hp.get("class_names"),
        image_size=hp.get("image_size"),
        backbone=hp["backbone"],
        mean=tuple(hp["mean"]),
        std=tuple(hp["std"]),
        scheduler=None,
        task=hp.get("task", "multiclass"),
        threshold=hp.get("threshold", 0.5),
    )
    # torch.compile'd modules save their weights under `_orig_mod.`; the plain module has none
    state = {k.replace("_orig_mod.", ""): v for k, v in checkpoint["state_dict"].items()}
    model.load_state_dict(state)
    # built without weights (the state dict has them): the config of the weights it was trained from
    model.pretrained_config = preprocessing(hp["backbone"], hp.get("weights"))
    return model.eval()


def export_checkpoint(
    ckpt_path: str | Path,
    images: Sequence[Path] = (),
    output_dir: str | Path | None = None,
    opset: int = 18,
    datamodule: object = None,
    unknown_accept: float | None = calibration.DEFAULT_ACCEPT,
    unknown_score: str = "energy",
    quantize: str | None = None,
    calibrate: bool = True,
) -> Exported:
    """Export `ckpt_path` next to it (or into `output_dir`); verify on random and real images.

    With `datamodule` (its validation images on disk) the sidecar also gets a temperature and an
    unknown threshold accepting the share `unknown_accept` (0 or None: off) of validation images
    (`project.calibrate`); `quantize="int8"` also writes `<stem>-int8.onnx` (`project.quantize`).
    """
    check_accept(unknown_accept, "unknown_accept")
    check_score(unknown_score, "unknown_score")
    if quantize not in (None, "int8"):
        raise UserError(f"quantize={quantize!r} is not supported.", "pass --quantize int8, or leave it out.")
    ckpt_path = Path(ckpt_path).resolve()
    if not ckpt_path.is_file():
        raise UserError(f"Checkpoint '{ckpt_path}' does not exist.", "pass --ckpt_path PATH to a .ckpt file.")
    checkpoint = load_checkpoint_file(ckpt_path)
    model = load_for_export(checkpoint)
    deployable = Deployable(model).eval()
    size = model.image_size or 224
    crop_ratio = checkpoint.get("datamodule_hyper_parameters", {}).get("crop_ratio", 0.875)
    run = ckpt_path.parent.name
    monitor, score = _monitored(checkpoint)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    metric = f"-{monitor.replace('/', '_')}={score:.4f}" if score is not None else ""
    out = Path(output_dir) if output_dir is not None else ckpt_path.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{run}{metric}-{stamp}"
    final = {fmt: out / f"{stem}.{fmt}" for fmt in (*FORMATS, "json")}
    # renamed into place together once verified, in this order: the sidecar appears last
    with atomic_files(*final.values()) as partials:
        partial = dict(zip(final, partials, strict=True))
        # the .pt2; the ONNX fallback exporter starts from this same program (see _onnx_verified)
        program = torch.export.export(deployable, (_example(size),), dynamic_shapes=_dynamic_batch())
        with open(partial["pt2"], "wb") as f:
            torch.export.save(program, f)
        batches = verification_batches(size, crop_ratio, images)
        exporter, verification = _onnx_verified(deployable, program, size, partial, opset, batches)
        metadata = _sidecar(
            checkpoint, ckpt_path, model, crop_ratio, run, monitor, score, opset, verification
        )
        metadata["onnx_exporter"] = exporter
        metadata.update(
            calibrate_export(
                deployable, datamodule, size, crop_ratio, model.multilabel, unknown_accept, unknown_score
            )
            if calibrate
            else calibration_skipped("turned off (calibrate=false)")
        )
        metadata["files"] = {fmt: final[fmt].name for fmt in FORMATS}
        partial["json"].write_text(json.dumps(metadata, indent=2) + "\n")
    for fmt, path in final.items():
        atomic_symlink(out / f"latest.{fmt}", path.name)
    if quantize == "int8":
        from project.quantize import quantize_export

        quantize_export(final["onnx"], datamodule)
    return Exported(final["onnx"], final["pt2"], final["json"], metadata)


def _example(size: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)


def _dynamic_batch() -> dict:
    return {"images": {0: torch.export.Dim("batch", min=1, max=4096)}}


def _onnx_verified(
    model: nn.Module,
    program: torch.export.ExportedProgram,
    size: int,
    paths: dict[str, Path],
    opset: int,
    batches: dict[str, torch.Tensor],
) -> tuple[str, dict]:
    """Write `paths["onnx"]` and verify it and `paths["pt2"]`; returns the exporter used and the report.

    The TorchScript exporter goes first: it writes the file in 0.3-0.4 s where the torch.export-based
    one takes 2.9-8.2 s, most of it decomposing `program` again (resnet18, mobilenet_v3_small;
    `bench/onnx_exporters.py`); onnxruntime runs the two graphs within 5% of each other but for one
    case (resnet18 32 px, batch 1: 16% slower). It is deprecated in torch, so any failure of it,
    or a file that fails verification, falls back to the torch.export-based exporter, verified
    the same way.
    """
    if _write_onnx_torchscript(model, size, paths["onnx"], opset):
        try:
            return "torchscript", verify(model, paths["onnx"], paths["pt2"], batches)
        except ExportError:
            pass
    _write_onnx(program, size, paths["onnx"], opset)
    return "torch.export", verify(model, paths["onnx"], paths["pt2"], batches)


def _write_onnx_torchscript(model: nn.Module, size: int, path: Path, opset: int) -> bool:
    """The TorchScript exporter's file at `path`, dynamic batch; False where it cannot export `model`."""
    try:
        with warnings.catch_warnings():
            # its deprecation notice and tracer warnings: the file is verified instead
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (_example(size),),
                str(path),
                input_names=["images"],
                output_names=["logits"],
                dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}},
                opset_version=opset,
                dynamo=False,
            )
    except Exception:  # an operator it cannot convert, or a torch without it: the other exporter
        return False
    return True


def _write_onnx(program: torch.export.ExportedProgram, size: int, path: Path, opset: int) -> None:
    torch.onnx.export(
        program,
        (_example(size),),
        str(path),
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes=_dynamic_batch(),
        opset_version=opset,
        external_data=False,
        dynamo=True,
        verbose=False,
    )


def verification_batches(size: int, crop_ratio: float, images: Sequence[Path]) -> dict[str, torch.Tensor]:
    """Random uint8 batches of 1 and 7, and 1 and 7 real images (given files, else drawn shapes)."""
    generator = torch.Generator().manual_seed(0)
    random = torch.randint(0, 256, (7, 3, size, size), dtype=torch.uint8, generator=generator)
    transform = eval_transform(size, crop_ratio)
    if images:
        real = torch.stack([transform(load_rgb(Path(p))) for p in list(images)[:7]])
    else:
        rng = np.random.default_rng(0)
        drawn = [draw_shape(CLASSES[i % len(CLASSES)], size, rng) for i in range(7)]
        real = torch.stack([transform(torch.from_numpy(np.asarray(d)).permute(2, 0, 1)) for d in drawn])
    return {"random-1": random[:1], "random-7": random, "real-1": real[:1], f"real-{len(real)}": real}


def verify(model: nn.Module, onnx_path: Path, pt2_path: Path, batches: dict[str, torch.Tensor]) -> dict:
    """Compare onnxruntime and the reloaded .pt2 with `model`; raise ExportError on any mismatch."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        with open(pt2_path, "rb") as f:
            program = torch.export.load(f).module()
    except Exception as e:  # onnxruntime and torch.export raise their own types for unreadable files
        raise ExportError(f"Export verification failed: an exported file does not load ({e}).") from None
    report: dict[str, dict] = {}
    failures = []
    for name, batch in batches.items():
        with torch.no_grad():
            expected = model(batch).numpy()
            candidates = {
                "onnxruntime": session.run(["logits"], {"images": batch.numpy()})[0],
                "pt2": program(batch).numpy(),
            }
        scale = float(np.abs(expected).max())
        bound = ATOL + RTOL * scale
        for runtime, logits in candidates.items():
            diff = float(np.abs(logits - expected).max())
            same_top1 = bool((logits.argmax(1) == expected.argmax(1)).all())
            report.setdefault(runtime, {})[name] = {
                "max_abs_diff": diff,
                "max_abs_logit": scale,
                "bound": bound,
                "top1_equal": same_top1,
            }
            if not (diff <= bound and same_top1):
                failures.append(
                    f"{runtime} on {name}: max |logit diff| {diff:.2e} (bound {bound:.2e} for logits up "
                    f"to {scale:.3g}), top-1 equal: {same_top1}"
                )
    if failures:
        raise ExportError(
            f"Export verification failed ({'; '.join(failures)}; bound {ATOL:g} + {RTOL:g} x max |logit|); "
            "no file was kept.",
            "check that the backbone exports cleanly (torch.export) or try another --opset.",
        )
    tolerance = {"atol": ATOL, "rtol": RTOL, "rule": "max |diff| <= atol + rtol * max |logit|, per batch"}
    return {"passed": True, "tolerance": tolerance, "batches": list(batches), "results": report}


def _monitored(checkpoint: dict) -> tuple[str, float | None]:
    for key, state in checkpoint.get("callbacks", {}).items():
        if key.startswith("ModelCheckpoint") and state.get("current_score") is not None:
            return state["monitor"], float(state["current_score"])
    return "val/acc", None


def _sidecar(
    checkpoint: dict,
    ckpt_path: Path,
    model: ImageClassifier,
    crop_ratio: float,
    run: str,
    monitor: str,
    score: float | None,
    opset: int,
    verification: dict,
) -> dict:
    import onnx
    import onnxruntime

    size = model.image_size or 224
    hp = checkpoint["hyper_parameters"]
    multilabel = model.multilabel
    return {
        "class_names": model.label_names,
        "image_size": size,
        "task": model.task,
        **({"threshold": model.threshold} if multilabel else {}),
        "input": {"name": "images", "shape": ["N", 3, size, size], "dtype": "uint8", "layout": "NCHW, RGB"},
        "output": {
            "name": "logits",
            "shape": ["N", hp["num_classes"]],
            "meaning": "logits (a sigmoid per label for probabilities)"
            if multilabel
            else "logits (softmax for probabilities)",
        },
        "preprocessing": {
            "resize": f"short side to round(image_size / crop_ratio) = {round(size / crop_ratio)}, "
            "bilinear, antialiased",
            "crop": f"centre crop {size}x{size}",
            "crop_ratio": crop_ratio,
            "normalization": {"mean": list(hp["mean"]), "std": list(hp["std"]), "baked_in": True},
        },
        "source_checkpoint": {"path": str(ckpt_path), "sha256": _sha256(ckpt_path)},
        "metrics": {
            monitor: score,
            "epoch": checkpoint.get("epoch"),
            "global_step": checkpoint.get("global_step"),
        },
        "backbone": hp["backbone"],
        # what the backbone's pretrained weights expect (timm: its pretrained config), for reference
        "pretrained_config": dict(model.pretrained_config),
        "run": run,
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
