"""One image through the served model: decoded and preprocessed, run in a batch, shaped into an answer.

Decoding and preprocessing are exactly those of `infer`. An image remembers the model it was
preprocessed for, so that a batch formed across a reload runs each image on its own model and
answers with that model's version and class names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from project.deploy.outputs import Outputs
from project.deploy.serve import bodies
from project.deploy.serve.models import LoadedModel

# room: unknown begin
from project.deploy.unknown import UNKNOWN

# room: unknown end


@dataclass(frozen=True)
class Prepared:
    """One request's image, ready for a batch: the model it was preprocessed for travels with it."""

    model: LoadedModel
    array: np.ndarray  # uint8 [3, size, size]
    width: int
    height: int
    image_format: str | None


def prepare(data: bytes, model: LoadedModel, max_pixels: int) -> Prepared:
    """Decode and preprocess exactly as `infer` does (runs in the decode pool)."""
    image, image_format = bodies.decode(data, max_pixels)
    return Prepared(model, model.classifier.preprocess(image), image.width, image.height, image_format)


def run_batch(items: Sequence[Prepared]) -> list[tuple[Outputs, int]]:
    """(outputs, batch size) per item. Items preprocessed for an older model run on that model."""
    results: list[tuple[Outputs, int]] = [(Outputs(np.empty(0)), 0)] * len(items)
    groups: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(id(item.model), []).append(i)
    for indices in groups.values():
        model = items[indices[0]].model
        outputs = model.classifier.run(np.stack([items[i].array for i in indices]))
        for j, i in enumerate(indices):
            features = None if outputs.features is None else outputs.features[j]
            results[i] = (Outputs(outputs.logits[j], features), len(indices))
    return results


def answer(model: LoadedModel, outputs: Outputs, top_k: int, batch_size: int) -> dict:
    """The JSON answer for one image's outputs: its top-k classes.

    Their probabilities are calibrated by the export's temperature.  # room: calibration

    An image below the export's threshold is answered `unknown`, saying why (`unknown`).  # room: unknown
    """
    classifier = model.classifier
    probabilities = classifier.probabilities_of(outputs.logits[None])[0]
    names, probs = classifier.top(probabilities, top_k)
    result = {
        "version": model.version,
        "predictions": [{"class_name": n, "probability": p} for n, p in zip(names, probs, strict=True)],
        "batch_size": batch_size,
    }
    # room: multilabel begin
    if classifier.multilabel:  # every label at or above the export's threshold, not only the top k
        threshold = classifier.threshold
        result["labels"] = [
            n for n, p in zip(classifier.class_names, probabilities, strict=True) if p >= threshold
        ]
        return result
    # room: multilabel end
    result["class_name"] = names[0]
    # room: unknown begin
    features = None if outputs.features is None else outputs.features[None]
    unknown, scores = classifier.unknown(Outputs(outputs.logits[None], features))
    result["class_name"] = UNKNOWN if unknown[0] else names[0]
    if scores is not None:
        calibration = classifier.calibration
        result["unknown"] = {
            "score": calibration.score_name,
            "value": float(scores[0]),
            "threshold": calibration.threshold,
            "accept": calibration.accept,
            "reason": calibration.reason(float(scores[0])) or None,  # why it is `unknown`
        }
    # room: unknown end
    return result
