"""The calibration step of `export`: a temperature and an unknown threshold fitted on the validation split.

The temperature T minimizes the negative log-likelihood of softmax(logits / T) on the validation
images (LBFGS on log T, so T stays positive), within [MIN_TEMPERATURE, MAX_TEMPERATURE]; the
expected calibration error (torchmetrics, 15 equal-width bins) is measured before and after. A
temperature at the upper bound means the model is near chance on validation: calibrating would
flatten every probability towards 1/C, so calibration is refused (skipped, saying why).

The unknown score: each one available (`project.deploy.calibration.SCORES`; `knn` where the network
outputs features, against a bank of training images' features, `project.deploy.feature_bank`) is
measured on the validation images and on foreign images made here (`project.export.foreign`): its
threshold accepts the share `accept` of the validation images, and the share of foreign images it
answers `unknown` decides. The one that answers the most of them `unknown` is kept (ties: the order of
SCORES), unless `--unknown_score` names one; the sidecar records every score's figures and why.
What comes out goes into the sidecar, and `project.deploy.calibration` applies it identically in
predict, infer and serve.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, default_collate
from torchmetrics.classification import MulticlassCalibrationError

from project.data.dataset import collate_skipping_none
from project.data.source import data_at_hand
from project.data.transforms import Interpolation, eval_transform
from project.deploy import calibration
from project.deploy.calibration import FEATURE_SCORES, SCORES, Outputs
from project.deploy.feature_bank import FeatureBank, descriptors, rows_for
from project.errors import UserError
from project.export.foreign import foreign_images

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
    """The validation images (at most MAX_IMAGES) preprocessed as `infer` does; ValueError saying why not."""
    return split_loader(datamodule, "val", size, crop_ratio, MAX_IMAGES, batch_size, interpolation)


def split_loader(
    datamodule: object,
    split: str,
    size: int,
    crop_ratio: float,
    count: int,
    batch_size: int = 64,
    interpolation: Interpolation = "bilinear",
) -> DataLoader:
    """Up to `count` images of `split`, evenly spaced, preprocessed as `infer` does; ValueError saying why
    there are none.

    Images the data module holds decoded (`--data.cache`) are read from memory, in this process.
    """
    source = data_at_hand(datamodule)  # image files or shards alike
    if source.count(split) == 0:
        raise ValueError(f"'{source.where}' has no {'validation' if split == 'val' else split} images")
    # decoded at setup by --data.cache (the export at the end of fit): read there, no workers to start
    decoded = (getattr(datamodule, "decoded", None) or {}).get(split)
    # --data.skip_bad_images holds here as in training: a file that does not decode is left out
    skip = bool(getattr(datamodule, "skip_bad_images", False))
    dataset = source.samples(split, count, eval_transform(size, crop_ratio, interpolation), skip)
    workers = 0 if decoded is not None else int(getattr(datamodule, "num_workers", 0) or 0)
    collate = collate_skipping_none if skip else default_collate
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate)


def good_batches(loader: DataLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The (images, targets) batches of `loader`, less those whose every image was skipped as bad."""
    return (batch for batch in loader if batch is not None)


def outputs_of(
    model: nn.Module, images: torch.Tensor, describe: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits, descriptors or None) of `model` on uint8 `images`: a Deployable's features beside the
    images' statistics (`feature_bank.descriptors`, what the knn score compares), any other's logits."""
    out = model(images)
    logits, features = out if isinstance(out, tuple) else (out, None)
    if features is None or not describe:
        return logits.float(), None
    return logits.float(), torch.from_numpy(descriptors(features.float().numpy(), images.numpy()))


@torch.no_grad()
def collect(
    model: nn.Module, loader: DataLoader, describe: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(logits [N, C] float32, descriptors [N, D + 72] or None, labels [N]) of `model` (uint8 images in)
    over `loader`; `describe=False` leaves the descriptors out (None)."""
    logits, features, labels = [], [], []
    for images, targets in good_batches(loader):
        batch_logits, batch_features = outputs_of(model, images, describe)
        logits.append(batch_logits)
        features.append(batch_features)
        labels.append(targets.long())
    if not logits:
        return torch.empty(0, 0), None, torch.empty(0, dtype=torch.long)
    kept = None if features[0] is None else torch.cat(features)
    return torch.cat(logits), kept, torch.cat(labels)


def collect_logits(model: nn.Module, loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [N, C] float32, labels [N]) of `model` (uint8 images in) over `loader`."""
    logits, _, labels = collect(model, loader, describe=False)  # no image statistics to compute
    return logits, labels


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


@dataclass(frozen=True)
class Evidence:
    """What the unknown scores are measured on besides the validation logits.

    Args:
        features: The validation images' penultimate features [N, D]; None: the model outputs none.
        bank: The training images' features, for the knn score; None: no knn score.
        foreign: The model's outputs on the foreign images (`project.export.foreign`).
        kinds: How many foreign images of each kind.
        why_no_bank: Why there is no bank, when there is none.
    """

    features: np.ndarray | None = None
    bank: FeatureBank | None = None
    foreign: Outputs | None = None
    kinds: dict[str, int] = field(default_factory=dict)
    why_no_bank: str = ""


def calibrate(
    logits: torch.Tensor,
    labels: torch.Tensor,
    accept: float | None,
    score_name: str,
    temperature: float | None = None,
    evidence: Evidence | None = None,
) -> dict:
    """The sidecar's calibration keys for validation (logits, labels); fits the temperature unless given.

    `score_name` is the unknown score to use, or `auto`: the one `choose` picks from the measurements.
    """
    evidence = evidence or Evidence()
    if temperature is None:
        temperature = fit_temperature(logits, labels)
    before = logits.double().softmax(1)
    after = torch.from_numpy(calibration.softmax(logits.numpy(), temperature))
    correct = (after.argmax(1) == labels).numpy()
    measured_at = accept or calibration.DEFAULT_ACCEPT  # the figures need a share even with rejection off
    own, figures = {}, {}
    for name in available_scores(evidence):
        own[name] = calibration.score(logits.numpy(), name, temperature, evidence.features, evidence.bank)
        figures[name] = measure_score(own[name], correct, measured_at, name, temperature, evidence)
    chosen, why = choose(figures, score_name, measured_at, evidence)
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
        "unknown_score": chosen,
        "unknown_accept": accept if accept else None,
        "unknown_quantiles": calibration.quantiles(own[chosen]),
        # every score measured at the same acceptance of validation images, and why `chosen` is used
        "unknown_scores": {"measured_at_accept": measured_at, **figures},
        "unknown_choice": why,
        "unknown_foreign_images": dict(evidence.kinds),
    }
    result["unknown_threshold"] = (
        calibration.threshold_for(result["unknown_quantiles"], accept) if accept else None
    )
    return result


def available_scores(evidence: Evidence) -> list[str]:
    """The scores that can be computed: the feature-space ones only with features and a bank."""
    with_features = evidence.features is not None and evidence.bank is not None
    return [name for name in SCORES if name not in FEATURE_SCORES or with_features]


def measure_score(
    own: np.ndarray, correct: np.ndarray, accept: float, name: str, temperature: float, evidence: Evidence
) -> dict:
    """One score's figures: at the threshold accepting `accept` of the validation images, the share of
    foreign images answered `unknown`; how well it ranks validation above foreign images and right
    answers above wrong ones (AUROC, 0.5 chance)."""
    threshold = calibration.threshold_for(calibration.quantiles(own), accept)
    figures: dict = {"threshold": threshold, "validation_unknown": float((own < threshold).mean())}
    if evidence.foreign is not None:
        foreign = calibration.score(
            evidence.foreign.logits, name, temperature, evidence.foreign.features, evidence.bank
        )
        figures["foreign_unknown"] = float((foreign < threshold).mean())
        figures["auroc_validation_vs_foreign"] = separation(own, foreign)
    figures["auroc_right_vs_wrong"] = (
        separation(own[correct], own[~correct]) if 0 < correct.sum() < len(correct) else None
    )
    return figures


def choose(figures: dict[str, dict], requested: str, accept: float, evidence: Evidence) -> tuple[str, str]:
    """(the score to use, why): `requested`, or with `auto` the one that answers the most foreign images
    `unknown` (within one image of the best: the first in SCORES)."""
    if requested != "auto":
        if requested not in figures:
            raise UserError(
                f"--unknown_score={requested} needs the network's features and a bank of training "
                f"images' features, and this export has none ({evidence.why_no_bank}).",
                f"pass --unknown_score auto or one of {', '.join(figures)}.",
            )
        return requested, f"{requested}: asked for (--unknown_score={requested})"
    if evidence.foreign is None:
        return SCORES[-1], "max_probability: no foreign images to measure the scores on"
    margin = 1 / max(len(evidence.foreign.logits), 1)
    best = max(f["foreign_unknown"] for f in figures.values())
    chosen = next(name for name in figures if figures[name]["foreign_unknown"] >= best - margin)
    shares = ", ".join(f"{name} {f['foreign_unknown']:.0%}" for name, f in figures.items())
    why = (
        f"{chosen}: at the threshold accepting {accept:.0%} of the validation images it answers the most of "
        f"the {len(evidence.foreign.logits)} foreign images `unknown` ({shares})"
    )
    if evidence.why_no_bank:
        why += f"; knn not measured: {evidence.why_no_bank}"
    return chosen, why


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


@dataclass(frozen=True)
class Fitted:
    """What calibration gives an export: the sidecar's keys, and the feature bank to write beside it."""

    keys: dict
    bank: FeatureBank | None = None


def calibrate_export(
    model: nn.Module,
    datamodule: object,
    size: int,
    crop_ratio: float,
    multilabel: bool,
    accept: float | None,
    score_name: str,
    interpolation: Interpolation = "bilinear",
    class_names: Sequence[str] = (),
) -> Fitted:
    """Calibration keys for the sidecar (and the feature bank); prints why when it is skipped."""
    if multilabel:
        return Fitted(_skip("a multi-label model has a sigmoid per label, not one softmax to calibrate"))
    try:
        loader = validation_loader(datamodule, size, crop_ratio, interpolation=interpolation)
    except ValueError as e:
        return Fitted(_skip(str(e)))
    logits, features, labels = collect(model, loader)
    if len(labels) == 0:
        return Fitted(_skip("every validation image was skipped as bad"))
    temperature = fit_temperature(logits, labels)
    if temperature >= MAX_TEMPERATURE:
        return Fitted(_skip(flattening(logits, labels)))
    evidence = gather_evidence(
        model, datamodule, loader, features, class_names, (size, crop_ratio, interpolation)
    )
    result = checked_calibration(logits, labels, accept, score_name, temperature, evidence)
    print(
        f"Calibrated on {len(labels)} validation images: temperature {result['temperature']:.3f}, "
        f"ECE {result['ece_before']:.4f} -> {result['ece_after']:.4f}"
        + (
            f"; below {result['unknown_score']} {result['unknown_threshold']:.4f} an image is `unknown` "
            f"({accept:.0%} of validation images accepted). Chose {result['unknown_choice']}"
            if accept
            else "; unknown rejection off"
        )
        + (f". Note: {result['calibration_note']}" if "calibration_note" in result else "")
    )
    return Fitted(result, evidence.bank if result["unknown_score"] in FEATURE_SCORES else None)


def gather_evidence(
    model: nn.Module,
    datamodule: object,
    validation: DataLoader,
    features: torch.Tensor | None,
    class_names: Sequence[str],
    preprocessing: tuple[int, float, Interpolation],
) -> Evidence:
    """The validation features, the training images' feature bank and the foreign images' outputs."""
    size = preprocessing[0]
    first = next(good_batches(validation))[0]
    made = foreign_images(size, list(first), class_names)
    with torch.no_grad():
        logits, foreign_features = outputs_of(model, torch.cat(list(made.values())))
    foreign = Outputs(logits.numpy(), None if foreign_features is None else foreign_features.numpy())
    kinds = {name: len(images) for name, images in made.items()}
    if features is None:
        reason = "the network's classification layer is not a Linear, so the export has no features"
        return Evidence(foreign=foreign, kinds=kinds, why_no_bank=reason)
    bank, reason = training_bank(model, datamodule, features.shape[1], preprocessing)
    if bank is not None:
        bank = bank.standardized(features.numpy())  # each block's similarity on validation: mean, spread
    return Evidence(features.numpy(), bank, foreign, kinds, reason)


def training_bank(
    model: nn.Module, datamodule: object, dim: int, preprocessing: tuple[int, float, Interpolation]
) -> tuple[FeatureBank | None, str]:
    """(the features of up to `rows_for(dim)` training images, evenly spaced, or None; why none)."""
    size, crop_ratio, interpolation = preprocessing
    try:
        loader = split_loader(
            datamodule, "train", size, crop_ratio, rows_for(dim, MAX_IMAGES), interpolation=interpolation
        )
    except ValueError as e:
        return None, str(e)
    _, features, _ = collect(model, loader)
    if features is None or len(features) == 0:
        return None, "every training image read for the feature bank was skipped as bad"
    return FeatureBank.of(features.numpy()), ""


def checked_calibration(
    logits: torch.Tensor,
    labels: torch.Tensor,
    accept: float | None,
    score_name: str,
    temperature: float,
    evidence: Evidence | None = None,
) -> dict:
    """`calibrate` with the fitted temperature, or with T = 1 where that made the calibration error worse
    on these images (the fit minimizes the log-loss, which a small or odd split can trade against ECE);
    a `calibration_note` says so, and when the figures rest on fewer than FEW_IMAGES images."""
    result = calibrate(logits, labels, accept, score_name, temperature, evidence)
    notes = []
    if result["ece_after"] > result["ece_before"]:
        notes.append(
            f"the fitted temperature {temperature:.3f} made the calibration error worse on these images "
            f"(ECE {result['ece_before']:.4f} -> {result['ece_after']:.4f}), so T = 1 is kept"
        )
        result = calibrate(logits, labels, accept, score_name, 1.0, evidence)
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
