"""An exported file is kept only when it computes what the PyTorch model does, on random and real images."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from project.data.shapes import CLASSES, draw_shape
from project.data.source import data_at_hand
from project.data.transforms import Interpolation, eval_transform
from project.deploy.outputs import Outputs
from project.errors import UserError
from project.export.targets import TARGETS, Runner

# The max |logit difference| accepted between an exported and the PyTorch model, per batch:
# ATOL + RTOL * max |logit|. float32 rounding grows with the logits' scale: a resnet18 whose
# logits reach ~250 differs by 4.6e-4 to 1.4e-3 (a relative 5.6e-6) with nothing wrong, so a
# fixed bound refuses sound exports; a wrong weight or normalisation moves logits by far more.
ATOL, RTOL = 1e-4, 2e-5
# ... plus ROUNDING x float32's own error on the batch: the PyTorch model in float32 against float64.
# A barely trained network can be ill-conditioned: BatchNorm running variances near 1e-4 (depthwise
# layers on grayscale photos) give logits of ~1,000 on the random batch with large cancellations, and
# float32 then differs from the exact result by more than RTOL x max |logit| on any graph. An export
# folds BatchNorm into the convolutions, so its rounding is not PyTorch's: on 40 batch-outputs of five
# such mobilenet_v3_small checkpoints, its error was 0.5 to 5.9 times PyTorch's (docs/reliability.md).
ROUNDING = 10.0


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
    exact = _float64(model)
    for name, batch in batches.items():
        expected = _numpy(model, batch)
        error = _float32_error(expected, exact, batch)
        for target, run in runners.items():
            runtime = TARGETS[target].runtime
            outputs = run(batch.numpy())
            result, problems = _agree(expected, outputs, error)
            report.setdefault(runtime, {})[name] = result
            if problems:
                fixes.append(TARGETS[target].fix)
                failures.append(f"{runtime} on {name}: {'; '.join(problems)}")
    if failures:
        raise ExportError(
            f"Export verification failed ({'; '.join(failures)}; bound {ATOL:g} + {RTOL:g} x max |value| "
            f"+ {ROUNDING:g} x float32's own error); no file was kept.",
            fixes[0],
        )
    tolerance = {
        "atol": ATOL,
        "rtol": RTOL,
        "rounding": ROUNDING,
        "rule": "max |diff| <= atol + rtol * max |value| + rounding * max |PyTorch float32 - float64|, "
        "per batch and output",
    }
    return {"passed": True, "tolerance": tolerance, "batches": list(batches), "results": report}


def _outputs(model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = model(batch)
    return out if isinstance(out, tuple) else (out, None)


def _numpy(model: nn.Module, batch: torch.Tensor) -> Outputs:
    with torch.no_grad():
        return Outputs(*(None if t is None else t.double().numpy() for t in _outputs(model, batch)))


def _float64(model: nn.Module) -> nn.Module | None:
    """A float64 copy of `model`, or None where it has none (then float32's own error counts as 0)."""
    try:
        return copy.deepcopy(model).double()
    except (RuntimeError, TypeError):  # a module that cannot be copied or cast
        return None


def _float32_error(expected: Outputs, exact: nn.Module | None, batch: torch.Tensor) -> Outputs | None:
    """max |float32 - float64| of each output on `batch`; None where the float64 model does not run."""
    if exact is None:
        return None
    try:
        reference = _numpy(exact, batch)
    except RuntimeError:  # an operator without a float64 kernel
        return None
    logits = np.abs(expected.logits - reference.logits).max()
    features = None if expected.features is None else np.abs(expected.features - reference.features).max()
    return Outputs(logits, features)


def _bound(values: np.ndarray, own: float) -> float:
    """The max |difference| accepted on an output whose PyTorch values are `values`: ATOL + RTOL x their
    max |value| + ROUNDING x float32's own error `own` on them."""
    return ATOL + RTOL * float(np.abs(values).max()) + ROUNDING * own


def _agree(expected: Outputs, got: Outputs, error: Outputs | None) -> tuple[dict, list[str]]:
    """The comparison of one batch's outputs (logits: also the top-1, up to ties within the bound), and
    what disagrees; `error` is float32's own error on each (None: not measured, counted as 0 and
    recorded as null)."""
    scale = float(np.abs(expected.logits).max())
    own = 0.0 if error is None else float(error.logits)
    bound = _bound(expected.logits, own)
    diff = float(np.abs(got.logits - expected.logits).max())
    # the same top-1, or a class tied with it within the bound
    picked = np.take_along_axis(expected.logits, got.logits.argmax(1)[:, None], axis=1)[:, 0]
    same_top1 = bool((picked >= expected.logits.max(1) - bound).all())
    result = {
        "max_abs_diff": diff,
        "max_abs_logit": scale,
        "float32_error": None if error is None else own,
        "bound": bound,
        "top1_equal": same_top1,
    }
    problems = []
    if not (diff <= bound and same_top1):
        problems.append(
            f"max |logit diff| {diff:.2e} (bound {bound:.2e} for logits up to {scale:.3g}, "
            f"float32's own error {'not measured' if error is None else f'{own:.1e}'}), "
            f"top-1 equal: {same_top1}"
        )
    if expected.features is not None:
        if got.features is None or got.features.shape != expected.features.shape:
            problems.append("no features output of the expected shape")
            return result, problems
        own = 0.0 if error is None else float(error.features)
        feature_bound = _bound(expected.features, own)
        feature_diff = float(np.abs(got.features - expected.features).max())
        result |= {
            "features_max_abs_diff": feature_diff,
            "features_float32_error": None if error is None else own,
            "features_bound": feature_bound,
        }
        if not feature_diff <= feature_bound:
            problems.append(f"max |feature diff| {feature_diff:.2e} (bound {feature_bound:.2e})")
    return result, problems
