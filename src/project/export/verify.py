"""An exported file is kept only when it computes what the PyTorch model does, on random and real images."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from project.data.shapes import CLASSES, draw_shape
from project.data.source import data_at_hand
from project.data.transforms import Interpolation, eval_transform
from project.deploy.calibration import Outputs
from project.errors import UserError
from project.export.targets import TARGETS, Runner

# The max |logit difference| accepted between an exported and the PyTorch model, per batch:
# ATOL + RTOL * max |logit|. float32 rounding grows with the logits' scale: a resnet18 whose
# logits reach ~250 differs by 4.6e-4 to 1.4e-3 (a relative 5.6e-6) with nothing wrong, so a
# fixed bound refuses sound exports; a wrong weight or normalisation moves logits by far more.
ATOL, RTOL = 1e-4, 2e-5


class ExportError(UserError):
    """An export that failed verification: nothing was written under the final names."""


def validation_images(datamodule: object, count: int = 7) -> list[torch.Tensor]:
    """A few validation images of `datamodule` (decoded uint8 [3, H, W]; from files or shards, as its
    source holds them) to verify exports on, or none when its data is not at hand."""
    try:
        source = data_at_hand(datamodule)
    except ValueError:
        return []
    # --data.skip_bad_images holds here as in training: an image that does not decode is left out
    skip = bool(getattr(datamodule, "skip_bad_images", False))
    picks = source.samples("val", 2 * count, lambda image: image, skip)  # room for skipped ones
    images = (picks[i] for i in range(len(picks)))
    return [sample[0] for sample in images if sample is not None][:count]


def verification_batches(
    size: int, crop_ratio: float, images: Sequence[torch.Tensor], interpolation: Interpolation = "bilinear"
) -> dict[str, torch.Tensor]:
    """Random uint8 batches of 1 and 7, and 1 and 7 real images (given decoded images, else drawn shapes),
    the real ones resized with the run's `interpolation`."""
    generator = torch.Generator().manual_seed(0)
    random = torch.randint(0, 256, (7, 3, size, size), dtype=torch.uint8, generator=generator)
    transform = eval_transform(size, crop_ratio, interpolation)
    if images:
        real = torch.stack([transform(image) for image in list(images)[:7]])
    else:
        rng = np.random.default_rng(0)
        drawn = [draw_shape(CLASSES[i % len(CLASSES)], size, rng) for i in range(7)]
        real = torch.stack([transform(torch.from_numpy(np.asarray(d)).permute(2, 0, 1)) for d in drawn])
    return {"random-1": random[:1], "random-7": random, "real-1": real[:1], f"real-{len(real)}": real}


def verify(model: nn.Module, files: Mapping[str, Path], batches: dict[str, torch.Tensor]) -> dict:
    """Run exported files (target name -> its main file, any others beside it under the same stem)
    by their targets' runtimes and compare with `model`: `compare`'s report, or its ExportError."""
    loaded = {}
    for name, path in files.items():
        target = TARGETS[name]
        loaded[name] = {suffix: Path(path).with_suffix(f".{suffix}") for suffix in target.files}
    return compare(model, {name: load(name, paths) for name, paths in loaded.items()}, batches)


def load(name: str, files: Mapping[str, Path]) -> Runner:
    """Target `name`'s files, loaded to run; ExportError when they do not load."""
    try:
        return TARGETS[name].load(files)
    except Exception as e:  # each runtime raises its own types for an unreadable file
        raise ExportError(f"Export verification failed: an exported file does not load ({e}).") from None


def compare(model: nn.Module, runners: Mapping[str, Runner], batches: dict[str, torch.Tensor]) -> dict:
    """Each target's runner (by target name) against `model` on `batches`, logits and features alike: the
    report the sidecar keeps under `verification`; ExportError on any mismatch (the fix of the first
    target that failed)."""
    report: dict[str, dict] = {}
    failures, fixes = [], []
    for name, batch in batches.items():
        with torch.no_grad():
            expected = Outputs(*(None if t is None else t.numpy() for t in _outputs(model, batch)))
        for target, run in runners.items():
            runtime = TARGETS[target].runtime
            outputs = run(batch.numpy())
            result, problems = _agree(expected, outputs)
            report.setdefault(runtime, {})[name] = result
            if problems:
                fixes.append(TARGETS[target].fix)
                failures.append(f"{runtime} on {name}: {'; '.join(problems)}")
    if failures:
        raise ExportError(
            f"Export verification failed ({'; '.join(failures)}; bound {ATOL:g} + {RTOL:g} x max |value|); "
            "no file was kept.",
            fixes[0],
        )
    tolerance = {
        "atol": ATOL,
        "rtol": RTOL,
        "rule": "max |diff| <= atol + rtol * max |value|, per batch and output",
    }
    return {"passed": True, "tolerance": tolerance, "batches": list(batches), "results": report}


def _outputs(model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = model(batch)
    return out if isinstance(out, tuple) else (out, None)


def _agree(expected: Outputs, got: Outputs) -> tuple[dict, list[str]]:
    """The comparison of one batch's outputs (logits: also the top-1), and what disagrees."""
    scale = float(np.abs(expected.logits).max())
    bound = ATOL + RTOL * scale
    diff = float(np.abs(got.logits - expected.logits).max())
    same_top1 = bool((got.logits.argmax(1) == expected.logits.argmax(1)).all())
    result = {"max_abs_diff": diff, "max_abs_logit": scale, "bound": bound, "top1_equal": same_top1}
    problems = []
    if not (diff <= bound and same_top1):
        problems.append(
            f"max |logit diff| {diff:.2e} (bound {bound:.2e} for logits up to {scale:.3g}), "
            f"top-1 equal: {same_top1}"
        )
    if expected.features is not None:
        if got.features is None or got.features.shape != expected.features.shape:
            problems.append("no features output of the expected shape")
            return result, problems
        scale = float(np.abs(expected.features).max())
        feature_bound = ATOL + RTOL * scale
        feature_diff = float(np.abs(got.features - expected.features).max())
        result |= {"features_max_abs_diff": feature_diff, "features_bound": feature_bound}
        if not feature_diff <= feature_bound:
            problems.append(f"max |feature diff| {feature_diff:.2e} (bound {feature_bound:.2e})")
    return result, problems
