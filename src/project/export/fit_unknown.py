"""The unknown step of `export`'s calibration: which unknown score, and its threshold, fitted on validation.

Each score available (`project.deploy.unknown.SCORES`; `knn` where the network outputs features,
against a bank of training images' features, `project.deploy.feature_bank`) is measured on the
validation images and on foreign images made here (`project.export.foreign`): its threshold accepts
the share `accept` of the validation images, and the share of foreign images it answers `unknown`
decides. The one that answers the most of them `unknown` is kept (ties: the order of SCORES), unless
`--unknown_score` names one; the sidecar records every score's figures and why. It runs inside
`project.export.fit_calibration` at the temperature fitted there, and `project.deploy.calibration`
applies what it writes identically in predict, infer and serve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from project.data.transforms import Interpolation
from project.deploy import unknown
from project.deploy.feature_bank import FeatureBank, rows_for
from project.deploy.outputs import Outputs, softmax
from project.deploy.unknown import FEATURE_SCORES, SCORES
from project.errors import UserError
from project.export.foreign import foreign_images
from project.export.validation import MAX_IMAGES, collect, good_batches, outputs_of, split_loader


@dataclass(frozen=True)
class Evidence:
    """What the unknown scores are measured on besides the validation logits.

    Args:
        features: The validation images' descriptors (`feature_bank.descriptors`: penultimate features and
            image statistics) [N, D + 72]; None: the model outputs no features.
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


@dataclass(frozen=True)
class Request:
    """What the export asks of the unknown score: the share of validation images its threshold accepts
    (0 or None: no rejection), the score (`auto`: the one `choose` picks), and what it is measured on."""

    accept: float | None = unknown.DEFAULT_ACCEPT
    score_name: str = "auto"
    evidence: Evidence = field(default_factory=Evidence)

    def keys(self, logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> dict:
        """The sidecar's unknown keys for validation (logits, labels) at `temperature`."""
        accept, evidence = self.accept, self.evidence
        after = torch.from_numpy(softmax(logits.numpy(), temperature))
        correct = (after.argmax(1) == labels).numpy()
        measured_at = accept or unknown.DEFAULT_ACCEPT  # the figures need a share even with rejection off
        own, figures = {}, {}
        for name in available_scores(evidence):
            own[name] = unknown.score(logits.numpy(), name, temperature, evidence.features, evidence.bank)
            figures[name] = measure_score(own[name], correct, measured_at, name, temperature, evidence)
        chosen, why = choose(figures, self.score_name, measured_at, evidence)
        result = {
            "unknown_score": chosen,
            "unknown_accept": accept if accept else None,
            "unknown_quantiles": unknown.quantiles(own[chosen]),
            # every score measured at the same acceptance of validation images, and why `chosen` is used
            "unknown_scores": {"measured_at_accept": measured_at, **figures},
            "unknown_choice": why,
            "unknown_foreign_images": dict(evidence.kinds),
        }
        result["unknown_threshold"] = (
            unknown.threshold_for(result["unknown_quantiles"], accept) if accept else None
        )
        return result

    def bank_kept(self, keys: dict) -> FeatureBank | None:
        """The feature bank the export writes beside the model: the one its chosen score reads, if any."""
        return self.evidence.bank if keys.get("unknown_score") in FEATURE_SCORES else None


def said(keys: dict) -> str:
    """What `export` says of the threshold it fitted (`keys`: the sidecar's)."""
    if not keys["unknown_accept"]:
        return "; unknown rejection off"
    return (
        f"; below {keys['unknown_score']} {keys['unknown_threshold']:.4f} an image is `unknown` "
        f"({keys['unknown_accept']:.0%} of validation images accepted). Chose {keys['unknown_choice']}"
    )


def separation(known: np.ndarray, other: np.ndarray) -> float:
    """AUROC of telling `known` scores (should be higher) from `other` ones: 0.5 chance, 1 perfect."""
    from torchmetrics.functional.classification import binary_auroc

    scores = torch.from_numpy(np.concatenate([known, other]).astype(np.float64))
    target = torch.cat([torch.ones(len(known)), torch.zeros(len(other))]).long()
    return float(binary_auroc(scores, target))


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
    threshold = unknown.threshold_for(unknown.quantiles(own), accept)
    figures: dict = {"threshold": threshold, "validation_unknown": float((own < threshold).mean())}
    if evidence.foreign is not None:
        foreign = unknown.score(
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
        logits, foreign_features = outputs_of(model, torch.cat(list(made.values())), features=True)
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
    _, features, _ = collect(model, loader, features=True)
    if features is None or len(features) == 0:
        return None, "every training image read for the feature bank was skipped as bad"
    return FeatureBank.of(features.numpy()), ""
