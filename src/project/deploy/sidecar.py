"""An export's JSON sidecar: the contract between `export`, which writes it, and every reader.

`Sidecar` is that contract as a type. `export` builds one (`Sidecar.from_dict`) and writes it;
infer, serve, `predict` and `report` read one with `Sidecar.load`.
`--quantize int8` reads the float model's and writes its own as export does (its agreement,  # room: int8
accuracies and latency are keys that no reader checks, as `metrics` is).  # room: int8
Both go through `check`, the one validation: a sidecar may come from another machine or be edited
by hand, and a wrong value does not fail loudly later (a string where the class names belong lists
its letters as classes), so each such value is refused with one message naming the file and the key.
A negative temperature, which would invert the ranking, is refused so too.  # room: calibration
Whether the class names fit the model's outputs is checked where the model is loaded
(`project.deploy.classifier.Classifier`).

The format has a `version` (absent: 1, the sidecars written before it had one). A reader refuses a
sidecar from a newer template, whose keys it may misread, with one message saying to upgrade. An
export is written with the oldest version that reads it right (`version_for`): version 2 added
`preprocessing.interpolation`, which a version 1 reader ignores (it resizes bilinear), so only an
export that resizes otherwise (bicubic) is version 2.
# room: unknown begin

A NaN `unknown_threshold` would answer every image `unknown`: the unknown keys are checked as the others.
Version 3 added the `knn` unknown score and its `feature_bank` (the file of training features beside
the model), which an older reader cannot apply.
# room: unknown end
"""

from __future__ import annotations

import itertools  # room: unknown
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import (
    dataclass,
    field,
    replace,  # room: unknown
)
from pathlib import Path
from typing import Any

# room: unknown begin
from project.deploy import feature_bank

# room: unknown end
# room: calibration begin
from project.deploy.calibration import Calibration

# room: calibration end
# room: unknown begin
from project.deploy.unknown import FEATURE_SCORES, SCORES

# room: unknown end
from project.errors import UserError

VERSION = 3  # the newest sidecar format this template writes; it reads this one and every older one
INTERPOLATIONS = ("bilinear", "bicubic")  # the resize filters (absent: bilinear, as version 1 resized)
TASKS = (  # the `task` a sidecar may name
    "multiclass",
    "multilabel",  # room: multilabel
)
MAX_IMAGE_SIZE = 8192  # the resize before the crop stays below this too (a crop ratio near 0 would not)
MAX_BINS = 1000  # reliability diagram bins (export writes 15)  # room: calibration
# room: unknown begin
QUANTILES = 101  # unknown.quantiles: shares 0, 1, ..., 100 %
# the fewest columns a feature bank row has: one network feature and the image statistics
MIN_BANK_COLUMNS = 1 + sum(width for _, width in feature_bank.IMAGE_BLOCKS)
# room: unknown end
FIX = "export the checkpoint again with `python -m project export` (or correct the key)."


@dataclass(frozen=True)
class Sidecar:
    """An export's sidecar, checked: the values its readers use, typed, and the whole document.

    Build one with `Sidecar.from_dict` or `Sidecar.load` (both run `check`), never field by field.

    Args:
        class_names: The model's classes (labels), in the order of its logits.
        image_size: The square input the model takes, in pixels.
        crop_ratio: image_size / the short side before the centre crop.
        interpolation: The resize filter, bilinear or bicubic (antialiased).
        task: `multiclass` (one softmax)
            or `multilabel` (a sigmoid per label).  # room: multilabel
        threshold: The probability from which a label is given (multi-label).  # room: multilabel
        temperature: Divides the logits before the softmax (1: uncalibrated).  # room: calibration
        unknown_score: `knn`, `energy` or `max_probability`; None: no calibration.  # room: unknown
        unknown_threshold: Below it an image is `unknown`; None: never.  # room: unknown
        unknown_quantiles: The validation images' scores at shares 0, 1, ..., 100 %.  # room: unknown
        unknown_accept: The share of validation images the threshold accepts.  # room: unknown
        files: The export's files by target (`onnx`: its file name).
        source_checkpoint: The path of the checkpoint it was exported from.
        reliability: The reliability diagram's bins before and after the temperature.  # room: calibration
        feature_bank: The knn score's training features: `file`, `rows`, `dim`, `sha256`.  # room: unknown
        path: Where the sidecar was read from.
        version: The sidecar format's version.
        document: The JSON object as written, every key (what `to_dict` returns).
    """

    class_names: tuple[str, ...]
    image_size: int
    crop_ratio: float
    interpolation: str = "bilinear"
    task: str = "multiclass"
    threshold: float = 0.5  # room: multilabel
    temperature: float = 1.0  # room: calibration
    # room: unknown begin
    unknown_score: str | None = None
    unknown_threshold: float | None = None
    unknown_quantiles: tuple[float, ...] | None = None
    unknown_accept: float | None = None
    # room: unknown end
    files: Mapping[str, str] = field(default_factory=dict)
    source_checkpoint: str | None = None
    reliability: Mapping[str, Any] | None = None  # room: calibration
    feature_bank: Mapping[str, Any] | None = None  # room: unknown
    path: Path | None = field(default=None, compare=False, repr=False)
    version: int = VERSION
    document: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, meta: Any, path: Path | str) -> Sidecar:
        """`meta` (a sidecar's JSON object) checked by `check`; `path` names it in the messages."""
        check(meta, path)
        quantiles = meta.get("unknown_quantiles")  # room: unknown
        return cls(
            class_names=tuple(meta["class_names"]),
            image_size=meta["image_size"],
            crop_ratio=float(meta["preprocessing"]["crop_ratio"]),
            interpolation=meta["preprocessing"].get("interpolation", INTERPOLATIONS[0]),
            task=meta.get("task", "multiclass"),
            threshold=float(meta.get("threshold", 0.5)),  # room: multilabel
            temperature=float(meta.get("temperature") or 1.0),  # room: calibration
            # room: unknown begin
            unknown_score=meta.get("unknown_score"),
            unknown_threshold=_float_or_none(meta.get("unknown_threshold")),
            unknown_quantiles=None if quantiles is None else tuple(float(q) for q in quantiles),
            unknown_accept=_float_or_none(meta.get("unknown_accept")),
            # room: unknown end
            files=dict(meta.get("files") or {}),
            source_checkpoint=source_of(meta),
            reliability=meta.get("reliability"),  # room: calibration
            feature_bank=meta.get("feature_bank"),  # room: unknown
            path=Path(path),
            version=meta.get("version", 1),
            document=dict(meta),
        )

    @classmethod
    def load(cls, path: Path) -> Sidecar:
        """The sidecar at `path`, checked; UserError naming the file (and the key) otherwise."""
        try:
            meta = json.loads(Path(path).read_bytes())
        except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise UserError(
                f"Sidecar '{path}' is not a readable JSON file ({type(e).__name__}: {e}).", FIX
            ) from None
        return cls.from_dict(meta, path)

    # room: multilabel begin
    @property
    def multilabel(self) -> bool:
        """Any number of labels per image (a sigmoid each); else one class (a softmax)."""
        return sidecar_multilabel(self.document)

    # room: multilabel end

    @property
    def resize_to(self) -> int:
        """The short side before the centre crop, as validation resized."""
        return round(self.image_size / self.crop_ratio)

    # room: calibration begin
    def calibration(
        self,
        accept: float | None = None,  # room: unknown
    ) -> Calibration:
        """The temperature to apply.

        # room: unknown begin
        And the unknown threshold; `accept` (0: off) overrides the share. A `knn` score reads the feature
        bank beside the sidecar, checked (`FeatureBank.load`).
        # room: unknown end
        """
        calibration = Calibration.from_sidecar(
            self.document,
            accept,  # room: unknown
        )
        # room: unknown begin
        if calibration.needs_features:
            return replace(calibration, bank=self.bank())
        # room: unknown end
        return calibration

    # room: calibration end

    # room: unknown begin
    def bank(self) -> feature_bank.FeatureBank | None:
        """The feature bank beside the sidecar, checked (`FeatureBank.load`); None where it names none."""
        if self.feature_bank is None:
            return None
        where = self.path or Path(".")
        return feature_bank.FeatureBank.load(
            where.parent / self.feature_bank["file"], dict(self.feature_bank), where
        )

    # room: unknown end

    def to_dict(self) -> dict[str, Any]:
        """The JSON object to write: the document, unchanged (a round trip gives it back)."""
        return dict(self.document)

    def public(self) -> dict[str, Any]:
        """The document without the checkpoint's path (its sha256 still identifies it): what serve shows."""
        source = self.document.get("source_checkpoint")
        if not isinstance(source, dict):
            return self.to_dict()
        return {**self.document, "source_checkpoint": {k: v for k, v in source.items() if k != "path"}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def version_for(
    interpolation: str,
    unknown_score: str | None = None,  # room: unknown
) -> int:
    """The sidecar version an export resized with `interpolation` is written with: the oldest whose
    readers do as it does (version 1 readers resize bilinear)."""
    # room: unknown begin
    if unknown_score in FEATURE_SCORES:  # answering `unknown` by it: version 2 readers know no such score
        return 3
    # room: unknown end
    return 1 if interpolation == "bilinear" else 2


def source_of(meta: Any) -> str | None:
    """The checkpoint path a JSON object names as a sidecar would (None: it names none, not a sidecar).

    Finds the sidecar of a checkpoint among a folder's JSON files; the one found is then checked whole.
    """
    source = meta.get("source_checkpoint") if isinstance(meta, dict) else None
    path = source.get("path") if isinstance(source, dict) else None
    return path if isinstance(path, str) else None


# room: multilabel begin
def sidecar_multilabel(meta: Mapping) -> bool:
    """Whether an export sidecar's model is multi-label (its `task`); without a task: multi-class."""
    return meta.get("task") == "multilabel"


# room: multilabel end


@dataclass(frozen=True)
class Rule:
    """What one key of a sidecar must hold: `ok(meta)` sees the whole sidecar, and the rules before it
    have passed (a later rule may read what an earlier one checked)."""

    key: str  # dotted: `preprocessing.crop_ratio`
    expected: str | Callable[[dict], str]  # what the error says was expected (from the sidecar: a function)
    ok: Callable[[dict], bool]


def _optional(key: str, test: Callable[[Any], bool]) -> Callable[[dict], bool]:
    """A rule's test for a key that may be absent or null."""
    return lambda meta: _get(meta, key) is None or test(_get(meta, key))


def _class_names(names: Any) -> bool:
    return isinstance(names, list) and bool(names) and all(isinstance(n, str) and n for n in names)


def _crop(meta: dict) -> bool:
    ratio = meta["preprocessing"].get("crop_ratio")
    return _number(ratio, 0, 1, low_open=True) and round(meta["image_size"] / ratio) <= MAX_IMAGE_SIZE


# room: unknown begin
def _increasing(table: Any) -> bool:
    return (
        isinstance(table, list)
        and len(table) == QUANTILES
        and all(_number(q, -math.inf, math.inf) for q in table)
        and all(a <= b for a, b in itertools.pairwise(table))
    )


def _bank_file(name: Any) -> bool:
    suffix = "." + feature_bank.SUFFIX
    return isinstance(name, str) and name.endswith(suffix) and name == Path(name).name and name[0] != "."


def _bank(test: Callable[[dict], bool]) -> Callable[[dict], bool]:
    """A rule's test of the `feature_bank` object, when there is one (an object: checked before)."""
    return lambda meta: meta.get("feature_bank") is None or test(meta["feature_bank"])


def _most_rows(bank: dict) -> int:
    return feature_bank.rows_for(bank["dim"], feature_bank.MAX_ROWS)


def _bank_blocks(bank: dict) -> list[list[Any]]:
    return [list(b) for b in feature_bank.blocks_for(bank["dim"])]


def _sha256(digest: Any) -> bool:
    return isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


# room: unknown end


def _whole(value: Any, low: int, high: int) -> bool:
    """Whether `value` is a JSON whole number (not a bool) within [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check_version(meta: dict, path: Path | str) -> None:
    """A sidecar of a newer format may mean its keys otherwise: refused before any of them is read."""
    version = meta.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        shown = repr(version) if len(repr(version)) <= 80 else repr(version)[:77] + "..."
        raise UserError(f"Sidecar '{path}': 'version' is {shown}; expected a whole number from 1.", FIX)
    if version > VERSION:
        raise UserError(
            f"Sidecar '{path}' was written by a newer version of this template (sidecar version "
            f"{version}; this one reads up to version {VERSION}).",
            "upgrade the project (git pull, or pip install -U) to run this export, or export the "
            "checkpoint again with this version (`python -m project export`).",
        )


# room: calibration begin
def _reliability(value: Any) -> bool:
    """Whether `value` is a reliability table as calibration writes it: what `report` draws."""
    if not isinstance(value, dict):
        return False
    bins = value.get("bins")
    if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= MAX_BINS:
        return False
    for part in ("before", "after"):
        columns = value.get(part)
        if not isinstance(columns, dict):
            return False
        for key in ("confidence", "accuracy", "count"):
            column = columns.get(key)
            if not (isinstance(column, list) and len(column) == bins):
                return False
            if not all(_number(v, 0, 1 if key != "count" else math.inf) for v in column):
                return False
    return True


# room: calibration end


# room: unknown begin
def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


# room: unknown end


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


# Every key the deploy side reads, in the order checked; the first that fails is the one error.
RULES: tuple[Rule, ...] = (
    Rule(
        "class_names",
        "a list of the class names, non-empty strings",
        lambda m: _class_names(m.get("class_names")),
    ),
    Rule("class_names", "distinct names", lambda m: len(set(m["class_names"])) == len(m["class_names"])),
    Rule("task", f"one of {', '.join(TASKS)}", lambda m: m.get("task", "multiclass") in TASKS),
    # room: multilabel begin
    Rule(
        "threshold",
        "a probability between 0 and 1 (exclusive)",
        lambda m: (
            not sidecar_multilabel(m) or _number(m.get("threshold", 0.5), 0, 1, low_open=True, high_open=True)
        ),
    ),
    # room: multilabel end
    Rule(
        "image_size",
        f"a whole number of pixels from 1 to {MAX_IMAGE_SIZE}",
        lambda m: _whole(m.get("image_size"), 1, MAX_IMAGE_SIZE),
    ),
    Rule(
        "preprocessing", "an object with the crop_ratio", lambda m: isinstance(m.get("preprocessing"), dict)
    ),
    Rule(
        "preprocessing.crop_ratio",
        f"a number in (0, 1] with image_size / crop_ratio <= {MAX_IMAGE_SIZE}",
        _crop,
    ),
    Rule(
        "preprocessing.interpolation",
        f"one of {', '.join(INTERPOLATIONS)} (or absent: bilinear)",
        lambda m: m["preprocessing"].get("interpolation", INTERPOLATIONS[0]) in INTERPOLATIONS,
    ),
    # room: calibration begin
    Rule(
        "temperature",
        "a finite number > 0 (or null)",
        _optional("temperature", lambda v: _number(v, 0, math.inf, low_open=True)),
    ),
    # room: calibration end
    # room: unknown begin
    Rule(
        "unknown_score",
        f"one of {', '.join(SCORES)} (or null)",
        _optional("unknown_score", lambda v: v in SCORES),
    ),
    Rule(
        "unknown_threshold",
        "a finite number (or null)",
        _optional("unknown_threshold", lambda v: _number(v, -math.inf, math.inf)),
    ),
    Rule(
        "unknown_quantiles",
        f"{QUANTILES} finite numbers in increasing order (or null)",
        _optional("unknown_quantiles", _increasing),
    ),
    Rule(
        "unknown_accept",
        "a share from 0 to 1 (or null)",
        _optional("unknown_accept", lambda v: _number(v, 0, 1)),
    ),
    Rule(
        "feature_bank",
        lambda m: f"the training features file the {m['unknown_score']} score needs",
        lambda m: (
            m.get("feature_bank") is not None
            or m.get("unknown_score") not in FEATURE_SCORES
            or m.get("unknown_threshold") is None
        ),
    ),
    Rule(
        "feature_bank",
        "an object describing the training features file (or absent)",
        _optional("feature_bank", lambda v: isinstance(v, dict)),
    ),
    Rule(
        "feature_bank.file",
        f"a file name ending in .{feature_bank.SUFFIX}, beside the sidecar",
        _bank(lambda bank: _bank_file(bank.get("file"))),
    ),
    Rule(
        "feature_bank.dim",
        f"the columns per image, a whole number from {MIN_BANK_COLUMNS} (features + statistics)",
        _bank(
            lambda bank: _whole(
                bank.get("dim"), MIN_BANK_COLUMNS, feature_bank.MAX_BYTES // feature_bank.DTYPE.itemsize
            )
        ),
    ),
    Rule(
        "feature_bank.rows",
        lambda m: (
            f"a whole number from 1 to {_most_rows(m['feature_bank'])} (at most {feature_bank.MAX_ROWS} "
            f"images, {feature_bank.MAX_BYTES} bytes)"
        ),
        _bank(lambda bank: _whole(bank.get("rows"), 1, _most_rows(bank))),
    ),
    Rule(
        "feature_bank.blocks",
        lambda m: f"{_bank_blocks(m['feature_bank'])}, the blocks of {m['feature_bank']['dim']} columns",
        _bank(lambda bank: bank.get("blocks", _bank_blocks(bank)) == _bank_blocks(bank)),
    ),
    Rule(
        "feature_bank.standardize",
        lambda m: (
            "a finite [mean, spread > 0] for each block: "
            + ", ".join(n for n, _ in feature_bank.blocks_for(m["feature_bank"]["dim"]))
        ),
        _bank(
            lambda bank: feature_bank.valid_standardize(
                bank.get("standardize"), feature_bank.blocks_for(bank["dim"])
            )
        ),
    ),
    Rule(
        "feature_bank.k",
        f"{feature_bank.K}, the neighbour this template's knn score reads",
        _bank(lambda bank: bank.get("k", feature_bank.K) == feature_bank.K),
    ),
    Rule(
        "feature_bank.sha256",
        "the file's sha256, 64 lowercase hex digits",
        _bank(lambda bank: _sha256(bank.get("sha256"))),
    ),
    # room: unknown end
    Rule(
        "files",
        "an object naming each exported file, e.g. the .onnx (or absent)",
        _optional("files", lambda v: isinstance(v, dict) and all(isinstance(f, str) for f in v.values())),
    ),
    Rule(
        "source_checkpoint",
        "an object with the checkpoint's path (or absent)",
        _optional("source_checkpoint", lambda v: isinstance(v, dict) and isinstance(v.get("path", ""), str)),
    ),
    # room: calibration begin
    Rule(
        "ece_before",
        "a calibration error from 0 to 1 (or null)",
        _optional("ece_before", lambda v: _number(v, 0, 1)),
    ),
    Rule(
        "ece_after",
        "a calibration error from 0 to 1 (or null)",
        _optional("ece_after", lambda v: _number(v, 0, 1)),
    ),
    Rule(
        "reliability",
        f"bins (1 to {MAX_BINS}) with a confidence, accuracy and count per bin, before and after",
        _optional("reliability", _reliability),
    ),
    # room: calibration end
)


def check(meta: Any, path: Path | str) -> None:
    """Nothing when every key the deploy side reads has a usable value (RULES); else UserError naming the
    first that does not."""
    if not isinstance(meta, dict):
        raise UserError(f"Sidecar '{path}' is not an export sidecar: it holds a {type(meta).__name__}.", FIX)
    _check_version(meta, path)
    for rule in RULES:
        if not rule.ok(meta):
            value = _get(meta, rule.key)
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            expected = rule.expected(meta) if callable(rule.expected) else rule.expected
            raise UserError(f"Sidecar '{path}': '{rule.key}' is {shown}; expected {expected}.", FIX)
