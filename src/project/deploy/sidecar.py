"""Reading an export's JSON sidecar: every value that infer, serve and predict use, checked in one place.

A sidecar may come from another machine or be edited by hand, and a wrong value does not fail
loudly later: a negative temperature inverts the ranking, a NaN threshold answers every image
`unknown`, a string where the class names belong lists its letters as classes. `load` refuses
each such value with one message naming the file and the key; whether the class names fit the
model's outputs is checked where the model is loaded (`project.deploy.classifier.Classifier`).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from project.deploy.calibration import SCORES
from project.errors import UserError

TASKS = ("multiclass", "multilabel")
QUANTILES = 101  # calibration.quantiles: shares 0, 1, ..., 100 %
MAX_IMAGE_SIZE = 8192  # the resize before the crop stays below this too (a crop ratio near 0 would not)
FIX = "export the checkpoint again with `python -m project export` (or correct the key)."


def sidecar_multilabel(meta: Mapping) -> bool:
    """Whether an export sidecar's model is multi-label (its `task`); without a task: multi-class."""
    return meta.get("task") == "multilabel"


def load(path: Path) -> dict:
    """The sidecar at `path`, checked by `check`; UserError naming the file (and the key) otherwise."""
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(
            f"Sidecar '{path}' is not a readable JSON file ({type(e).__name__}: {e}).", FIX
        ) from None
    check(meta, path)
    return meta


def check(meta: Any, path: Path | str) -> None:
    """Nothing when every key the deploy side reads has a usable value; else UserError naming the first."""
    if not isinstance(meta, dict):
        raise UserError(f"Sidecar '{path}' is not an export sidecar: it holds a {type(meta).__name__}.", FIX)

    def refuse(key: str, expected: str) -> NoReturn:
        value = _get(meta, key)
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise UserError(f"Sidecar '{path}': '{key}' is {shown}; expected {expected}.", FIX)

    names = meta.get("class_names")
    if not (isinstance(names, list) and names and all(isinstance(n, str) and n for n in names)):
        refuse("class_names", "a list of the class names, non-empty strings")
    if len(set(names)) != len(names):
        refuse("class_names", "distinct names")
    task = meta.get("task", "multiclass")
    if task not in TASKS:
        refuse("task", f"one of {', '.join(TASKS)}")
    if sidecar_multilabel(meta) and not _number(
        meta.get("threshold", 0.5), 0, 1, low_open=True, high_open=True
    ):
        refuse("threshold", "a probability between 0 and 1 (exclusive)")
    size = meta.get("image_size")
    if not (isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_IMAGE_SIZE):
        refuse("image_size", f"a whole number of pixels from 1 to {MAX_IMAGE_SIZE}")
    preprocessing = meta.get("preprocessing")
    if not isinstance(preprocessing, dict):
        refuse("preprocessing", "an object with the crop_ratio")
    ratio = preprocessing.get("crop_ratio")
    if not (_number(ratio, 0, 1, low_open=True) and round(size / ratio) <= MAX_IMAGE_SIZE):
        refuse(
            "preprocessing.crop_ratio", f"a number in (0, 1] with image_size / crop_ratio <= {MAX_IMAGE_SIZE}"
        )
    if meta.get("temperature") is not None and not _number(meta["temperature"], 0, math.inf, low_open=True):
        refuse("temperature", "a finite number > 0 (or null)")
    if meta.get("unknown_score") is not None and meta["unknown_score"] not in SCORES:
        refuse("unknown_score", f"one of {', '.join(SCORES)} (or null)")
    if meta.get("unknown_threshold") is not None and not _number(
        meta["unknown_threshold"], -math.inf, math.inf
    ):
        refuse("unknown_threshold", "a finite number (or null)")
    table = meta.get("unknown_quantiles")
    if table is not None and not (
        isinstance(table, list)
        and len(table) == QUANTILES
        and all(_number(q, -math.inf, math.inf) for q in table)
        and all(a <= b for a, b in itertools.pairwise(table))
    ):
        refuse("unknown_quantiles", f"{QUANTILES} finite numbers in increasing order (or null)")
    files = meta.get("files")
    if files is not None and not (isinstance(files, dict) and isinstance(files.get("onnx", ""), str)):
        refuse("files", "an object naming the .onnx file (or absent)")


def _number(value: Any, low: float, high: float, low_open: bool = False, high_open: bool = False) -> bool:
    """Whether `value` is a finite JSON number (not a bool) within [low, high] (ends open as told)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):  # JSON integers have no bound; float() of a huge one overflows
        value = min(max(value, -(2**1023)), 2**1023)
    if not math.isfinite(value):
        return False
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    return above and below


def _get(meta: Mapping, key: str) -> Any:
    """The value at a dotted `key` (None where it is missing)."""
    for part in key.split("."):
        meta = meta.get(part) if isinstance(meta, Mapping) else None
    return meta
