"""The calibration step of `export`: a temperature fitted on the validation split.

The temperature T minimizes the negative log-likelihood of softmax(logits / T) on the validation
images (LBFGS on log T, so T stays positive), within [MIN_TEMPERATURE, MAX_TEMPERATURE]; the
expected calibration error (torchmetrics, 15 equal-width bins) is measured before and after. A
temperature at the upper bound means the model is near chance on validation: calibrating would
flatten every probability towards 1/C, so calibration is refused (skipped, saying why).
The unknown threshold is fitted at the temperature kept (`fit_unknown`).  # room: unknown
What comes out goes into the sidecar, and `project.deploy.calibration` applies it identically in
predict, infer and serve.
"""

from __future__ import annotations

from collections.abc import Sequence  # room: unknown
from dataclasses import dataclass
from typing import TYPE_CHECKING  # room: unknown

import numpy as np
import torch
from torch import nn
from torchmetrics.classification import MulticlassCalibrationError

from project.data.transforms import Interpolation

# room: unknown begin
from project.deploy.feature_bank import FeatureBank

# room: unknown end
from project.deploy.outputs import softmax

# room: unknown begin
from project.deploy.unknown import DEFAULT_ACCEPT

# room: unknown end
from project.export.validation import FEW_IMAGES, collect, validation_loader

# room: unknown begin
if TYPE_CHECKING:
    from project.export.fit_unknown import Request
# room: unknown end

BINS = 15
# Temperatures that leave a model its answers: at 20 a logit gap of 10 (a confident answer) becomes
# 0.5, nearly flat; below 0.05 every answer is sharpened to one-hot. Unbounded, a near-chance model's
# fit ran off to 1.8e7 (every probability 1/C)
# and its energy threshold to ~3e7  # room: unknown
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.05, 20.0


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


def calibrate(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float | None = None,
    unknown: Request | None = None,  # room: unknown
) -> dict:
    """The sidecar's calibration keys for validation (logits, labels); fits the temperature unless given."""
    if temperature is None:
        temperature = fit_temperature(logits, labels)
    before = logits.double().softmax(1)
    after = torch.from_numpy(softmax(logits.numpy(), temperature))
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
    }
    # room: unknown begin
    if unknown is not None:  # the unknown score and its threshold, at this temperature
        result |= unknown.keys(logits, labels, temperature)
    # room: unknown end
    return result


def skipped(reason: str) -> dict:
    """The calibration keys of an export that could not be calibrated, and why."""
    return {
        "temperature": 1.0,
        "ece_before": None,
        "ece_after": None,
        "calibration_skipped": reason,
        "unknown_score": None,  # room: unknown
        "unknown_accept": None,  # room: unknown
        "unknown_threshold": None,  # room: unknown
    }


@dataclass(frozen=True)
class Fitted:
    """What calibration gives an export: the sidecar's keys."""

    keys: dict
    bank: FeatureBank | None = None  # room: unknown


def calibrate_export(
    model: nn.Module,
    datamodule: object,
    size: int,
    crop_ratio: float,
    interpolation: Interpolation = "bilinear",
    multilabel: bool = False,  # room: multilabel
    # room: unknown begin
    accept: float | None = DEFAULT_ACCEPT,
    score_name: str = "auto",
    class_names: Sequence[str] = (),
    # room: unknown end
) -> Fitted:
    """Calibration keys for the sidecar; prints why when it is skipped.

    # room: unknown begin
    Also the unknown threshold accepting the share `accept` of validation images (0 or None: off) by
    `score_name` (`auto`: measured), and the feature bank its score reads (`project.export.fit_unknown`).
    # room: unknown end
    """
    # room: multilabel begin
    if multilabel:
        return Fitted(_skip("a multi-label model has a sigmoid per label, not one softmax to calibrate"))
    # room: multilabel end
    try:
        loader = validation_loader(datamodule, size, crop_ratio, interpolation=interpolation)
    except ValueError as e:
        return Fitted(_skip(str(e)))
    collected = collect(
        model,
        loader,
        features=True,  # room: unknown
    )
    logits, labels = collected.logits, collected.labels
    if len(labels) == 0:
        return Fitted(_skip("every validation image was skipped as bad"))
    temperature = fit_temperature(logits, labels)
    if temperature >= MAX_TEMPERATURE:
        return Fitted(_skip(flattening(logits, labels)))
    # room: unknown begin
    from project.export import fit_unknown

    evidence = fit_unknown.gather_evidence(
        model, datamodule, loader, collected.features, class_names, (size, crop_ratio, interpolation)
    )
    unknown = fit_unknown.Request(accept, score_name, evidence)
    # room: unknown end
    result = checked_calibration(
        logits,
        labels,
        temperature,
        unknown,  # room: unknown
    )
    said = (
        f"Calibrated on {len(labels)} validation images: temperature {result['temperature']:.3f}, "
        f"ECE {result['ece_before']:.4f} -> {result['ece_after']:.4f}"
    )
    said += fit_unknown.said(result)  # room: unknown
    print(said + (f". Note: {result['calibration_note']}" if "calibration_note" in result else ""))
    return Fitted(
        result,
        unknown.bank_kept(result),  # room: unknown
    )


def checked_calibration(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    unknown: Request | None = None,  # room: unknown
) -> dict:
    """`calibrate` with the fitted temperature, or with T = 1 where that made the calibration error worse
    on these images (the fit minimizes the log-loss, which a small or odd split can trade against ECE);
    a `calibration_note` says so, and when the figures rest on fewer than FEW_IMAGES images."""
    result = calibrate(
        logits,
        labels,
        temperature,
        unknown,  # room: unknown
    )
    notes = []
    if result["ece_after"] > result["ece_before"]:
        notes.append(
            f"the fitted temperature {temperature:.3f} made the calibration error worse on these images "
            f"(ECE {result['ece_before']:.4f} -> {result['ece_after']:.4f}), so T = 1 is kept"
        )
        result = calibrate(
            logits,
            labels,
            1.0,
            unknown,  # room: unknown
        )
    if len(labels) < FEW_IMAGES:
        fitted = ["the temperature"]
        fitted.append("the `unknown` threshold")  # room: unknown
        rest = " and ".join(fitted) + (" rest" if len(fitted) > 1 else " rests")
        notes.append(
            f"only {len(labels)} validation images: {rest} on few images (hold out at least "
            f"{FEW_IMAGES} for figures that do not move from split to split)"
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
    said = f"Calibration skipped: {reason}. Probabilities are the plain softmax"
    said += " and no image is `unknown`"  # room: unknown
    print(said + ".")
    return skipped(reason)
