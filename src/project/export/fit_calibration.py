"""The calibration step of `export`: a temperature and an unknown threshold fitted on the validation split.

The temperature T minimizes the negative log-likelihood of softmax(logits / T) on the validation
images (LBFGS on log T, so T stays positive), within [MIN_TEMPERATURE, MAX_TEMPERATURE]; the
expected calibration error (torchmetrics, 15 equal-width bins) is measured before and after. A
temperature at the upper bound means the model is near chance on validation: calibrating would
flatten every probability towards 1/C, so calibration is refused (skipped, saying why). The
unknown threshold is the score that the share `accept` of the validation images reaches. What
comes out goes into the sidecar, and `project.deploy.calibration` applies it identically in
predict, infer and serve.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, default_collate
from torchmetrics.classification import MulticlassCalibrationError

from project.data.dataset import collate_skipping_none
from project.data.source import data_at_hand
from project.data.transforms import Interpolation, eval_transform
from project.deploy import calibration

BINS = 15
MAX_IMAGES = 10_000  # evenly spaced over the split beyond this: minutes, not hours, on a CPU
# Temperatures that leave a model its answers: at 20 a logit gap of 10 (a confident answer) becomes
# 0.5, nearly flat; below 0.05 every answer is sharpened to one-hot. Unbounded, a near-chance model's
# fit ran off to 1.8e7 (every probability 1/C) and its energy threshold to ~3e7.
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.05, 20.0
# Below this many validation images the figures calibration fits move by several points from one split
# to another (the standard error of an accuracy is up to 0.5 / sqrt(n): 3.5 points at 200)
FEW_IMAGES = 200


def validation_loader(
    datamodule: object,
    size: int,
    crop_ratio: float,
    batch_size: int = 64,
    interpolation: Interpolation = "bilinear",
) -> DataLoader:
    """The validation images (at most MAX_IMAGES) preprocessed as `infer` does; ValueError saying why not.

    Images the data module holds decoded (`--data.cache`) are read from memory, in this process.
    """
    source = data_at_hand(datamodule)  # image files or shards alike
    if source.count("val") == 0:
        raise ValueError(f"'{source.where}' has no validation images")
    # decoded at setup by --data.cache (the export at the end of fit): read there, no workers to start
    decoded = (getattr(datamodule, "decoded", None) or {}).get("val")
    # --data.skip_bad_images holds here as in training: a file that does not decode is left out
    skip = bool(getattr(datamodule, "skip_bad_images", False))
    dataset = source.samples("val", MAX_IMAGES, eval_transform(size, crop_ratio, interpolation), skip)
    workers = 0 if decoded is not None else int(getattr(datamodule, "num_workers", 0) or 0)
    collate = collate_skipping_none if skip else default_collate
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate)


def good_batches(loader: DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The (images, targets) batches of `loader`, less those whose every image was skipped as bad."""
    return (batch for batch in loader if batch is not None)


@torch.no_grad()
def collect_logits(model: nn.Module, loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [N, C] float32, labels [N]) of `model` (uint8 images in) over `loader`."""
    logits, labels = [], []
    for images, targets in good_batches(loader):
        logits.append(model(images).float())
        labels.append(targets.long())
    if not logits:
        return torch.empty(0, 0), torch.empty(0, dtype=torch.long)
    return torch.cat(logits), torch.cat(labels)


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The temperature in [MIN_TEMPERATURE, MAX_TEMPERATURE] minimizing the NLL of softmax(logits / T).

    The NLL is convex in 1/T, so the best temperature within the bounds is the unbounded one clamped.
    """
    log_t = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")
    logits, labels = logits.double(), labels.long()

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(logits / log_t.double().exp(), labels)
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    temperature = float(log_t.detach().exp())
    if temperature != temperature:  # NaN: no finite optimum on these logits; the flat side is safe
        return MAX_TEMPERATURE
    return min(max(temperature, MIN_TEMPERATURE), MAX_TEMPERATURE)


def ece(probabilities: torch.Tensor, labels: torch.Tensor) -> float:
    """Expected calibration error (L1, 15 equal-width bins of the top probability)."""
    metric = MulticlassCalibrationError(probabilities.shape[1], n_bins=BINS, norm="l1")
    return float(metric(probabilities.float(), labels))


def reliability(probabilities: np.ndarray, labels: np.ndarray) -> dict[str, list[float]]:
    """Per confidence bin: mean confidence, accuracy and count (what a reliability diagram draws)."""
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == labels
    bins = np.minimum((confidence * BINS).astype(int), BINS - 1)
    count = np.bincount(bins, minlength=BINS)
    safe = np.maximum(count, 1)
    return {
        "confidence": (np.bincount(bins, confidence, BINS) / safe).tolist(),
        "accuracy": (np.bincount(bins, correct, BINS) / safe).tolist(),
        "count": count.tolist(),
    }


def separation(known: np.ndarray, other: np.ndarray) -> float:
    """AUROC of telling `known` scores (should be higher) from `other` ones: 0.5 chance, 1 perfect."""
    from torchmetrics.functional.classification import binary_auroc

    scores = torch.from_numpy(np.concatenate([known, other]).astype(np.float64))
    target = torch.cat([torch.ones(len(known)), torch.zeros(len(other))]).long()
    return float(binary_auroc(scores, target))


def calibrate(
    logits: torch.Tensor,
    labels: torch.Tensor,
    accept: float | None,
    score_name: str,
    temperature: float | None = None,
) -> dict:
    """The sidecar's calibration keys for validation (logits, labels); fits the temperature unless given."""
    if temperature is None:
        temperature = fit_temperature(logits, labels)
    before = logits.double().softmax(1)
    after = torch.from_numpy(calibration.softmax(logits.numpy(), temperature))
    names = calibration.SCORES
    scores = {name: calibration.score(logits.numpy(), name, temperature) for name in names}
    correct = (after.argmax(1) == labels).numpy()
    result = {
        "temperature": temperature,
        "ece_before": ece(before, labels),
        "ece_after": ece(after, labels),
        "calibration_images": len(labels),
        "reliability": {
            "bins": BINS,
            "before": reliability(before.numpy(), labels.numpy()),
            "after": reliability(after.numpy(), labels.numpy()),
        },
        "unknown_score": score_name,
        "unknown_accept": accept if accept else None,
        "unknown_quantiles": calibration.quantiles(scores[score_name]),
        # how well each score tells right answers from wrong ones on validation (AUROC)
        "unknown_score_auroc_right_vs_wrong": {
            name: separation(s[correct], s[~correct]) if 0 < correct.sum() < len(correct) else None
            for name, s in scores.items()
        },
    }
    result["unknown_threshold"] = (
        calibration.threshold_for(result["unknown_quantiles"], accept) if accept else None
    )
    return result


def skipped(reason: str) -> dict:
    """The calibration keys of an export that could not be calibrated, and why."""
    return {
        "temperature": 1.0,
        "ece_before": None,
        "ece_after": None,
        "calibration_skipped": reason,
        "unknown_score": None,
        "unknown_accept": None,
        "unknown_threshold": None,
    }


def calibrate_export(
    model: nn.Module,
    datamodule: object,
    size: int,
    crop_ratio: float,
    multilabel: bool,
    accept: float | None,
    score_name: str,
    interpolation: Interpolation = "bilinear",
) -> dict:
    """Calibration keys for the sidecar; prints why when it is skipped."""
    if multilabel:
        return _skip("a multi-label model has a sigmoid per label, not one softmax to calibrate")
    try:
        loader = validation_loader(datamodule, size, crop_ratio, interpolation=interpolation)
    except ValueError as e:
        return _skip(str(e))
    logits, labels = collect_logits(model, loader)
    if len(labels) == 0:
        return _skip("every validation image was skipped as bad")
    temperature = fit_temperature(logits, labels)
    if temperature >= MAX_TEMPERATURE:
        return _skip(flattening(logits, labels))
    result = checked_calibration(logits, labels, accept, score_name, temperature)
    print(
        f"Calibrated on {len(labels)} validation images: temperature {result['temperature']:.3f}, "
        f"ECE {result['ece_before']:.4f} -> {result['ece_after']:.4f}"
        + (
            f"; below {result['unknown_score']} {result['unknown_threshold']:.4f} an image is `unknown` "
            f"({accept:.0%} of validation images accepted)"
            if accept
            else "; unknown rejection off"
        )
        + (f". Note: {result['calibration_note']}" if "calibration_note" in result else "")
    )
    return result


def checked_calibration(
    logits: torch.Tensor, labels: torch.Tensor, accept: float | None, score_name: str, temperature: float
) -> dict:
    """`calibrate` with the fitted temperature, or with T = 1 where that made the calibration error worse
    on these images (the fit minimizes the log-loss, which a small or odd split can trade against ECE);
    a `calibration_note` says so, and when the figures rest on fewer than FEW_IMAGES images."""
    result = calibrate(logits, labels, accept, score_name, temperature)
    notes = []
    if result["ece_after"] > result["ece_before"]:
        notes.append(
            f"the fitted temperature {temperature:.3f} made the calibration error worse on these images "
            f"(ECE {result['ece_before']:.4f} -> {result['ece_after']:.4f}), so T = 1 is kept"
        )
        result = calibrate(logits, labels, accept, score_name, 1.0)
    if len(labels) < FEW_IMAGES:
        notes.append(
            f"only {len(labels)} validation images: the temperature and the `unknown` threshold rest on few "
            f"images (hold out at least {FEW_IMAGES} for figures that do not move from split to split)"
        )
    if notes:
        result["calibration_note"] = "; ".join(notes)
    return result


def flattening(logits: torch.Tensor, labels: torch.Tensor) -> str:
    """Why a temperature at the upper bound is refused: what it says about the model."""
    accuracy = float((logits.argmax(1) == labels).double().mean())
    classes = logits.shape[1]
    return (
        f"the fitted temperature reached {MAX_TEMPERATURE:g}, the upper bound: the model is near chance "
        f"on the {len(labels)} validation images (accuracy {accuracy:.3f}, chance {1 / classes:.3f}) "
        f"and calibrating would flatten every probability towards 1/{classes} "
        "(train longer or check the labels, then export again)"
    )


def _skip(reason: str) -> dict:
    print(f"Calibration skipped: {reason}. Probabilities are the plain softmax and no image is `unknown`.")
    return skipped(reason)
