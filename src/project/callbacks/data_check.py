"""Look at the data before the first training step, and stop on what would waste the run."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

# room: trackers begin
from project.callbacks.trackers import send_text

# room: trackers end
from project.data.shapes import IMAGE_SIZE as SHAPES_IMAGE_SIZE
from project.errors import UserError
from project.export.validation import FEW_IMAGES

# room: multilabel begin
from project.model import is_multilabel

# room: multilabel end
from project.terminal import printable

PHOTO_SIDE = 128  # a median short side of at least this many pixels: photos, not thumbnails
PHOTO_SAMPLE = 32  # training images whose size (header only) is read


class DataCheck(Callback):
    """Class counts per split, then the first training batch: shape, dtype, value ranges and labels.

    Stops with one message on labels outside [0, num_classes), NaN/inf inputs or a constant batch;
    warns on imbalanced or empty classes, on a run too short to learn, and on photos trained with the
    shapes defaults. Costs one look at a batch that is trained on anyway, and the headers of 32 images.
    """

    def __init__(self, enabled: bool = True, imbalance_ratio: float = 3.0, min_steps: int = 100) -> None:
        """
        Args:
            enabled: Check the data before the first training step (`--data_check.enabled=false` skips it).
            imbalance_ratio: Warn when a split's largest class has more than this many times the images
                of its smallest.
            min_steps: Warn when the whole run takes fewer optimizer steps than this (0: never).
        """
        self.enabled = enabled
        self.imbalance_ratio = imbalance_ratio
        self.min_steps = min_steps
        self._batch_checked = False

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        self._batch_checked = False
        self._warn_short_run(trainer)
        num_classes = pl_module.hparams.get("num_classes")
        # the data format's answers (data/source.py): image files, a labels CSV or shards alike
        source = getattr(trainer.datamodule, "source", None)
        if source is None or num_classes is None:
            return
        multilabel = is_multilabel(pl_module)  # room: multilabel
        for split in source.split_names:
            labels = source.labels(split)  # None: checked as each sample is read (shards)
            if labels is not None:
                check_labels(
                    labels,
                    num_classes,
                    f"The {split} split",
                    multilabel,  # room: multilabel
                )
        counts = {split: source.class_counts(split) for split in source.split_names}
        table = class_count_table(counts)
        rank_zero_info(table)  # its class names are escaped: folder names may hold control characters
        log_text(trainer, "data_check/class_counts", table)
        balance = getattr(trainer.datamodule, "balance", "none")  # room: recipes
        for split, split_counts in counts.items():
            self._warn_imbalance(
                split,
                split_counts,
                balance if split == "train" else None,  # room: recipes
            )
        if "val" in counts:
            warn_small_validation(
                sum(counts["val"].values()),
                multilabel,  # room: multilabel
            )
        if "train" in source.split_names:
            warn_photos_with_shapes_defaults(trainer, source)

    def _warn_short_run(self, trainer: L.Trainer) -> None:
        """A run of a few optimizer steps (a small folder, a large batch, few epochs) ends where it began."""
        if trainer.fast_dev_run or trainer.sanity_checking:
            return
        steps = trainer.estimated_stepping_batches  # also sets num_training_batches
        if not math.isfinite(steps) or steps >= self.min_steps:
            return
        batches, epochs = trainer.num_training_batches, trainer.max_epochs
        per_epoch = max(1, int(batches) // trainer.accumulate_grad_batches) if math.isfinite(batches) else 0
        size = getattr(trainer.datamodule, "batch_size", None)
        how = f" ({int(batches)} batches{f' of {size}' if size else ''} an epoch x {epochs} epochs)"
        advice = "train longer"
        if per_epoch and epochs and epochs > 0:
            how = how if steps == per_epoch * epochs else ""
            advice = f"train longer (--trainer.max_epochs={math.ceil(self.min_steps / per_epoch)})"
        rank_zero_warn(
            f"This run takes only {int(steps)} optimizer steps in all{how}: too few to learn much (a model "
            f"needs a few hundred; fewer than {self.min_steps} is flagged). Fix: {advice}, a smaller "
            "--data.batch_size, or start from pretrained weights (--model.weights=DEFAULT)."
        )

    def _warn_imbalance(
        self,
        split: str,
        counts: dict[str, int],
        balance: str | None = None,  # room: recipes
    ) -> None:
        """Empty classes, or the largest class > imbalance_ratio x the smallest.
        # room: recipes begin
        `balance`: the train split's --data.balance (None for the other splits).
        # room: recipes end
        """
        empty = [name for name, n in counts.items() if n == 0]
        if empty:
            more = f" and {len(empty) - 10} more" if len(empty) > 10 else ""
            rank_zero_warn(f"The {split} split has no images of {len(empty)} class(es): {empty[:10]}{more}.")
            return
        most, least = max(counts, key=counts.get), min(counts, key=counts.get)
        if counts[most] <= self.imbalance_ratio * counts[least]:
            return
        found = (
            f"The {split} split is imbalanced: '{printable(most)}' has {counts[most]} images, "
            f"'{printable(least)}' {counts[least]} ({counts[most] / counts[least]:.0f}x)."
        )
        select = "--checkpoint.monitor=val/balanced_acc keeps the checkpoints that are best on every class"
        # room: recipes begin
        if balance == "none":
            rank_zero_warn(
                f"{found} Training will favour the large classes: consider --data.balance=sampler (each "
                f"class drawn equally often) or --data.balance=loss (class weights in the loss); {select}."
            )
            return
        if balance is not None:
            rank_zero_info(f"{found} Balanced by --data.balance={balance}.")
            return
        # room: recipes end
        rank_zero_warn(f"{found} val/acc favours the large classes: watch val/balanced_acc; {select}.")

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled or self._batch_checked or batch is None:
            return
        self._batch_checked = True
        if not (isinstance(batch, list | tuple) and len(batch) == 2):
            return  # not an (images, labels) batch: nothing this check knows how to read
        images, labels = batch
        num_classes = pl_module.hparams.get("num_classes")
        if num_classes is not None:
            check_labels(
                labels,
                num_classes,
                "The first training batch",
                is_multilabel(pl_module),  # room: multilabel
            )
        check_inputs(images)
        table = batch_table(images, labels, num_classes)
        rank_zero_info(table)
        log_text(trainer, "data_check/first_batch", table)


def warn_small_validation(
    images: int,
    multilabel: bool = False,  # room: multilabel
) -> None:
    """A validation split too small to rank checkpoints: its accuracy moves by more than the gap between
    epochs, so the best checkpoint (and the export made from it) is partly chance."""
    if images >= FEW_IMAGES or images == 0:
        return
    # room: multilabel begin
    if multilabel:  # per-label metrics, not one accuracy
        return
    # room: multilabel end
    error = 0.5 / math.sqrt(images)  # the standard error of an accuracy near 0.5
    rank_zero_warn(
        f"The validation split has only {images} images: val/acc has a standard error of up to "
        f"{error * 100:.1f} points (0.5 / sqrt({images})), so checkpoints closer than that are ranked by "
        "chance and the best checkpoint and its export"
        + " (and the calibration fitted on these images)"  # room: calibration
        + f" rest on noise. Fix: hold out at least {FEW_IMAGES} images (a larger --data.val_split or val/ "
        "folder), or compare runs by their last epochs rather than by one best value."
    )


def warn_photos_with_shapes_defaults(trainer: L.Trainer, source: Any) -> None:
    """Photos (a short side of at least twice the input) fed to the model at the embedded shapes' input
    size or smaller lose most of their detail, and a newcomer would not know which setting matters:
    point to the photo settings. Decided by the images and the input size, whatever the epochs or crops."""
    image_size = getattr(trainer.datamodule, "image_size", None)
    if image_size is None or image_size > SHAPES_IMAGE_SIZE:
        return
    sizes = source.image_sizes("train", PHOTO_SAMPLE)  # headers only
    if not sizes:
        return
    width, height = (int(np.median([size[axis] for size in sizes])) for axis in (0, 1))
    if min(width, height) < max(2 * image_size, PHOTO_SIDE):
        return
    rank_zero_warn(
        f"The training images look like photos (median {width}x{height} px, {len(sizes)} sampled), but this "
        f"run feeds the model {image_size} px inputs, the size tuned for the embedded {SHAPES_IMAGE_SIZE} px "
        "shapes: most of a photo's detail is lost. Fix: start from pretrained weights "
        "(--model.weights=DEFAULT, or a local file: the run then takes their input size), or --config "
        "configs/experiments/photos.yaml (128 px, stronger crops, 16 epochs), or set --data.image_size "
        'yourself (measured on photos: docs/training.md, "Photos").'
    )


def check_labels(
    labels: torch.Tensor | np.ndarray,
    num_classes: int,
    where: str,
    multilabel: bool = False,  # room: multilabel
) -> None:
    """Class indices [N] in [0, num_classes).
    # room: recipes begin
    Or soft targets [N, num_classes] (MixUp/CutMix).
    # room: recipes end
    # room: multilabel begin
    Multi-label: 0/1 targets [N, num_classes].
    # room: multilabel end

    Anything else fails later inside PyTorch (a device-side assert on GPU, a shape error on CPU).
    """
    labels = torch.as_tensor(labels).detach().cpu()
    if labels.numel() == 0:
        return
    # room: multilabel begin
    if multilabel:
        _check_multi_hot(labels, num_classes, where)
        return
    # room: multilabel end
    # room: recipes begin
    if labels.is_floating_point():
        return  # soft targets (probabilities per class): cross-entropy takes them as they are
    # room: recipes end
    if labels.ndim != 1:
        _refuse_shape(labels, num_classes, where)
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if bad.numel():
        values = sorted(set(bad.tolist()))[:10]
        raise UserError(
            f"{where} has {bad.numel()} label(s) outside [0, {num_classes}) (the model has "
            f"{num_classes} classes): {values}.",
            f"labels must be class indices 0..{num_classes - 1}: check the dataset's label mapping "
            "(1-based labels are the usual off-by-one) or the model's number of classes.",
        )


def _refuse_shape(labels: torch.Tensor, num_classes: int, where: str) -> None:
    """Integer labels of a multiclass model that are not a vector: say what they look like."""
    shape = f"[{', '.join(['N', *map(str, labels.shape[1:])])}]"
    binary = bool(((labels == 0) | (labels == 1)).all())
    if labels.ndim == 2 and labels.shape[1] == num_classes and binary and bool((labels.sum(1) == 1).all()):
        raise UserError(
            f"{where} has labels of shape {shape} that look one-hot; a multiclass model expects class "
            f"indices of shape [N] (0..{num_classes - 1}).",
            "turn them into indices (labels.argmax(dim=1)) in the dataset"
            # room: multilabel begin
            "; or, if an image may carry several classes, make the task multilabel (model task='multilabel')"
            # room: multilabel end
            ".",
        )
    raise UserError(
        f"{where} has labels of shape {shape}; class indices of shape [N] expected "
        f"(0..{num_classes - 1}, one per image).",
        "return one integer class per image from the dataset (labels[:, 0] or labels.squeeze(1) for "
        "[N, 1]), not a tensor per image.",
    )


# room: multilabel begin
def _check_multi_hot(labels: torch.Tensor, num_classes: int, where: str) -> None:
    """Multi-label targets: one 0/1 row of num_classes per image (float or integer)."""
    if labels.ndim != 2 or labels.shape[1] != num_classes:
        raise UserError(
            f"{where} has labels of shape {list(labels.shape)}; a multi-label model with {num_classes} "
            f"classes expects 0/1 targets of shape [N, {num_classes}].",
            "give each image a multi-hot row with one 0/1 entry per class (the labels CSV does this).",
        )
    bad = labels[(labels < 0) | (labels > 1)]
    if bad.numel():
        raise UserError(
            f"{where} has {bad.numel()} multi-label target(s) outside [0, 1]: "
            f"{sorted(set(bad.tolist()))[:10]}.",
            "give each image a multi-hot row: 1 for each class it shows, 0 otherwise.",
        )


# room: multilabel end


def check_inputs(images: torch.Tensor) -> None:
    """No NaN or inf values, and not one constant value across the whole batch."""
    if images.is_floating_point():
        finite = torch.isfinite(images)
        if not bool(finite.all()):
            nans, total = int(torch.isnan(images).sum()), int((~finite).sum())
            raise UserError(
                f"The first training batch has {nans} NaN and {total - nans} infinite input values "
                f"(of {images.numel()}).",
                "check the files and the dataset's transforms (a division by a zero std, a corrupt "
                "float image); the template's own pipeline yields uint8 images that cannot be NaN.",
            )
    low, high = images.min(), images.max()
    if bool(low == high):
        raise UserError(
            f"Every value of the first training batch is {low.item()}: the images are constant.",
            "check that the files are not blank and that the transforms do not erase them "
            "(a crop outside the image, a wrong normalization, a mask applied twice).",
        )


def label_values(labels: torch.Tensor) -> str:
    """What a batch's labels hold, for batch_table: their range."""
    # room: recipes begin
    if labels.is_floating_point() and labels.ndim == 2:
        return "class probabilities (MixUp/CutMix)"
    # room: recipes end
    return f"values {int(labels.min())}..{int(labels.max())}"


def batch_table(images: torch.Tensor, labels: torch.Tensor, num_classes: int | None) -> str:
    """The first batch as a few lines: shapes, dtypes, per-channel min/max/mean, label range."""
    x = images.detach().float()
    dims = [d for d in range(x.ndim) if d != 1]
    low, high, mean = (t.tolist() for t in (x.amin(dims), x.amax(dims), x.mean(dims)))
    lines = [
        "Data check: first training batch",
        f"  images {list(images.shape)} {images.dtype} on {images.device}",
        f"  labels {list(labels.shape)} {labels.dtype}, "
        + label_values(labels)
        + (f" (num_classes {num_classes})" if num_classes is not None else ""),
        f"  {'channel':>9} {'min':>8} {'max':>8} {'mean':>8}",
    ]
    lines += [
        f"  {c:>9} {lo:>8.2f} {hi:>8.2f} {m:>8.2f}"
        for c, (lo, hi, m) in enumerate(zip(low, high, mean, strict=True))
    ]
    return "\n".join(lines)


def class_count_table(counts: dict[str, dict[str, int]], rows: int = 20) -> str:
    """Images per class and split (`counts`: split -> class -> images), as a fixed-width table; past `rows`
    classes the largest and smallest half of `rows` by the first split's count (10,000 classes would be
    10,000 lines)."""
    first = next(iter(counts.values()))
    names = list(first)
    title = "Data check: images per class"
    if len(names) > rows:
        ranked = sorted(names, key=lambda n: -first[n])  # stable: label order among equal counts
        names = [*ranked[: rows // 2], None, *ranked[-(rows // 2) :]]  # None: the classes left out
        title += (
            f" ({len(first)} classes: the {rows // 2} largest and smallest by {next(iter(counts))} images)"
        )
    width = max(len("class"), *(len(printable(n)) for n in names if n is not None))
    header = f"  {'class':<{width}}" + "".join(f" {split:>8}" for split in counts)
    lines = [
        f"  {printable(n or '...'):<{width}}"
        + "".join(f" {'...' if n is None else c[n]:>8}" for c in counts.values())
        for n in names
    ]
    total = f"  {'total':<{width}}" + "".join(f" {sum(c.values()):>8}" for c in counts.values())
    return "\n".join([title, header, *lines, total])


def log_text(trainer: L.Trainer, tag: str, text: str) -> None:
    """Keep the table with the run: a text entry in TensorBoard (monospace via a Markdown code block), and a
    text file of each tracker's run (MLflow, W&B)."""
    send_text(trainer, tag, text)  # room: trackers
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger) and trainer.is_global_zero:
            logger.experiment.add_text(tag, "```\n" + text + "\n```", global_step=trainer.global_step)
