"""ImageDataModule: find the images, split them, and serve uint8 batches to the trainer."""

from __future__ import annotations

import os
import warnings
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np  # room: recipes
import torch
from lightning.pytorch.accelerators import CUDAAccelerator

# not exported by lightning.pytorch: an internal module, checked against lightning 2.6 (the pin is <2.7)
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    Sampler,
    WeightedRandomSampler,  # room: recipes
    default_collate,
)
from typing_extensions import override

from project.config_checks import fraction, positive_int, require

# room: cache begin
from project.data.batch_augment import MAX_PIXELS, BatchAugment, CachedBatches, uniform_shape, whole_batch
from project.data.cache import DecodedImages, auto_cache, decode_all

# room: cache end
from project.data.dataset import FileDataset, ImageDataset, collate_skipping_none
from project.data.folders import folder_splits
from project.data.index import HoldOut, ImageIndex, Splits, hold_out, list_images

# room: multilabel begin
from project.data.labels_csv import csv_splits
from project.data.multishapes import generate_multishapes

# room: multilabel end
from project.data.shapes import IMAGE_SIZE as SHAPES_IMAGE_SIZE
from project.data.shapes import generate_shapes
from project.data.skipped import SkipLog
from project.data.source import DataSource, FileSource, format_module, streamed_format
from project.data.transforms import (
    MODES,
    AutoAugment,
    Balance,  # room: recipes
    BatchMix,  # room: recipes
    Cache,  # room: cache
    Interpolation,
    eval_transform,
    train_transform,
)
from project.data.worker_reads import WorkerReads
from project.data.worker_signals import worker_init
from project.errors import UserError

EMBEDDED_ROOT = Path("data") / "shapes"
# evaluation resizes to image_size / 0.875 (256 for 224), then centre-crops: torchvision's weights' recipe
DEFAULT_CROP_RATIO = 0.875
DEFAULT_INTERPOLATION = "bilinear"  # torchvision's weights'; and every run's before the option existed
# room: multilabel begin
# the multi-label example (configs/experiments/multilabel.yaml): generated on first use, like the shapes
EMBEDDED_MULTILABEL_CSV = Path("data") / "multishapes" / "labels.csv"
# room: multilabel end


# Loader workers per usable CPU core at most: beyond a few per core they only queue for the cores, and
# --data.num_workers=1000 started ~700 processes (each with its own interpreter and prefetched batches).
MAX_WORKERS_PER_CORE = 4


def usable_cores() -> int:
    """The CPU cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_num_workers() -> int:
    """One loader worker per CPU core this process may use, at most 8."""
    return min(8, usable_cores())


def check_data_options(
    val_split: float | None,
    image_size: int,
    crop_ratio: float,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    batch_size: int,
    num_workers: int | None,
    prefetch_factor: int | None = None,
) -> None:
    """Reject values no run could use, before any file is read."""
    if val_split is not None:
        fraction("data.val_split", val_split)
    positive_int("data.image_size", image_size)
    require(0 < crop_ratio <= 1, "data.crop_ratio", crop_ratio, "a number in (0, 1], e.g. 0.875")
    require(0 < scale[0] <= scale[1] <= 1, "data.scale", list(scale), "[low, high] with 0 < low <= high <= 1")
    require(0 < ratio[0] <= ratio[1], "data.ratio", list(ratio), "[low, high] with 0 < low <= high")
    positive_int("data.batch_size", batch_size)
    if num_workers is not None:
        cores = usable_cores()
        most = MAX_WORKERS_PER_CORE * cores
        expected = (
            f"an integer from 0 to {most} ({MAX_WORKERS_PER_CORE} per CPU core: this process may use "
            f"{cores}; null: one per core, at most 8)"
        )
        require(0 <= num_workers <= most, "data.num_workers", num_workers, expected)
    if prefetch_factor is not None:
        positive_int("data.prefetch_factor", prefetch_factor)


# room: recipes begin
def check_recipe_options(mixup_alpha: float, cutmix_alpha: float) -> None:
    """MixUp/CutMix alphas are >= 0."""
    for key, alpha in (("data.mixup_alpha", mixup_alpha), ("data.cutmix_alpha", cutmix_alpha)):
        require(
            isinstance(alpha, int | float) and 0 <= alpha < float("inf"),
            key,
            alpha,
            "a number >= 0 (0: off; 0.2 to 1.0 are usual)",
        )


# room: recipes end
# room: multilabel begin
# room: recipes begin
def check_label_options(
    mixup_alpha: float, cutmix_alpha: float, balance: str, labels_csv: str | None
) -> None:
    """MixUp, CutMix and balance are for multiclass (class folder) data, not a labels CSV."""
    if labels_csv is None:
        return
    used = [f"--data.{k}={v}" for k, v in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)) if v]
    used += [f"--data.balance={balance}"] if balance != "none" else []
    if used:
        raise UserError(
            f"{', '.join(used)}: MixUp, CutMix and balance are for multiclass data (class folders), "
            f"but --data.labels_csv makes the task multilabel.",
            "remove those options for multi-label data.",
        )


# room: recipes end
# room: multilabel end


class ImageDataModule(L.LightningDataModule):
    """Images in ImageFolder layout: `root/{train,val[,test]}/<class>/*`, or `root/<class>/*` + val_split."""

    def __init__(
        self,
        root: str | None = None,
        val_split: float | None = None,
        split_seed: int = 0,
        num_classes: int | None = None,
        image_size: int | None = None,
        crop_ratio: float | None = None,
        interpolation: Interpolation | None = None,
        scale: tuple[float, float] = (0.7, 1.0),
        ratio: tuple[float, float] = (0.9, 1.11),
        hflip: bool = True,
        auto_augment: AutoAugment = "none",
        mixup_alpha: float = 0.0,  # room: recipes
        cutmix_alpha: float = 0.0,  # room: recipes
        balance: Balance = "none",  # room: recipes
        batch_size: int = 32,
        num_workers: int | None = None,
        prefetch_factor: int | None = None,
        loader_timeout: int = 600,
        skip_bad_images: bool = False,
        predict_dir: str | None = None,
        # room: multilabel begin
        labels_csv: str | None = None,
        label_delimiter: str = " ",
        # room: multilabel end
        # room: cache begin
        cache: Cache = "auto",
        batch_augment: bool = True,
        # room: cache end
    ) -> None:
        """
        Args:
            root: Folder of images; null means the embedded shapes data set, generated into data/shapes.
                Data in a streamed format (data/source.py's STREAMED, such as shards) is streamed.
            val_split: Fraction of each class held out for validation when root has no train/ and val/.
            split_seed: Seed of that split; kept apart from the training seed so the split never moves.
                Also the seed of a streamed format's shuffle (fixed: a resumed run draws the same order).
            num_classes: Expected number of classes, checked against the class folders (optional).
            image_size: Side of the square crops the model sees; null (the command line's default): a
                resumed checkpoint's, else the pretrained weights' input size (224 for most), else 64 (also
                when built in Python, where the backbone is not known).
            crop_ratio: Evaluation resizes the short side to image_size / crop_ratio, then centre-crops;
                null: the backbone's pretrained crop (a timm model's crop_pct; 0.875 for torchvision).
            interpolation: The resize filter of training crops, evaluation, `predict` and the export's
                `infer` and `serve`: bilinear or bicubic (antialiased); null: the backbone's pretrained
                interpolation (a timm model's, mostly bicubic; bilinear for torchvision).
            scale: RandomResizedCrop area range for training.
            ratio: RandomResizedCrop aspect-ratio range for training.
            hflip: Random horizontal flips for training.
            auto_augment: Extra training augmentation: none, trivialaugment or randaugment.
            # room: recipes begin
            mixup_alpha: MixUp training batches (blend pairs of images and their labels) with a weight
                drawn from Beta(alpha, alpha); 0 is off, 0.2 to 1.0 are usual. Multiclass only.
            cutmix_alpha: CutMix training batches (paste a patch of one image into another, labels in
                proportion to the area); 0 is off, 1.0 is usual. With mixup_alpha too, each batch gets
                one of the two at random.
            balance: Class imbalance: none; sampler (draw training images with replacement, each class
                equally often); or loss (weigh each class's cross-entropy by the inverse of its share of
                the training split). Multiclass only.
            # room: recipes end
            batch_size: Images per batch, per device.
            num_workers: DataLoader worker processes; null means one per CPU core (at most 8).
            prefetch_factor: Batches each worker keeps ready ahead of the training step; null means
                PyTorch's default (2). Ignored when num_workers is 0.
            loader_timeout: Seconds a loader waits for a batch from its workers before the run stops,
                naming each worker and the file it was reading (a stuck network file system, a decode
                that never returns); 0 waits forever. Ignored when num_workers is 0.
            skip_bad_images: Skip files that cannot be decoded (with a warning) instead of stopping.
            predict_dir: Folder of images (searched recursively) for `predict`.
            # room: multilabel begin
            labels_csv: Multi-label data: a CSV of `file,labels[,split]` rows (files relative to root, or
                to the CSV's folder when root is null). Makes the model multi-label (sigmoid + BCE).
                data/multishapes/labels.csv, the embedded example, is generated on first use.
            label_delimiter: What separates the labels in the CSV's labels column (" ": any whitespace).
            # room: multilabel end
            # room: cache begin
            cache: Decode the train and val images once, at setup, into shared memory, and read them
                from there every epoch: for images whose decoding is a large share of an epoch (from
                CIFAR's 32x32 to photos of a few hundred pixels a side). true: refused, with the
                numbers, when it would take over half the free memory. auto: `fit` caches (and says so
                in one line) when the images average at most 512x512 pixels and the decoded train +
                val of every process on the machine take at most a quarter of the available memory;
                otherwise, and in other commands, not.
            batch_augment: When the training images are cached and all of one size of at most
                128x128 pixels, crop, flip and auto-augment them a whole batch at a time in the
                loader workers (the same operations and distributions as the per-image transforms,
                each step within one grey level of theirs; several times faster on small images:
                data/batch_augment.py). false: torchvision's per-image transforms, as for uncached
                data.
            # room: cache end
        """
        super().__init__()
        # the command line sets the backbone's own size, crop and filter (cli.py); built directly: the
        # embedded shapes' size and torchvision's crop and filter
        image_size = SHAPES_IMAGE_SIZE if image_size is None else image_size
        crop_ratio = DEFAULT_CROP_RATIO if crop_ratio is None else crop_ratio
        interpolation = DEFAULT_INTERPOLATION if interpolation is None else interpolation
        require(interpolation in MODES, "data.interpolation", interpolation, "bilinear or bicubic")
        check_recipe_options(mixup_alpha, cutmix_alpha)  # room: recipes
        check_label_options(mixup_alpha, cutmix_alpha, balance, labels_csv)  # room: multilabel, recipes
        check_data_options(
            val_split, image_size, crop_ratio, scale, ratio, batch_size, num_workers, prefetch_factor
        )
        # num_classes and image_size are linked to the model and stored with it: one place, no disagreement
        self.save_hyperparameters(ignore=["num_classes", "image_size"])
        # resolved: checkpoints name the crop and the filter, not null
        self.hparams.update(crop_ratio=crop_ratio, interpolation=interpolation)
        self.root = Path(root) if root is not None else EMBEDDED_ROOT
        self.embedded = root is None
        # data in a streamed format (data/source.py's STREAMED, e.g. shards: a folder or an s3:// URL)
        streamed = root is not None
        streamed = streamed and labels_csv is None  # room: multilabel
        self._streamed = streamed_format(root) if streamed else None
        # room: multilabel begin
        self.labels_csv = Path(labels_csv) if labels_csv is not None else None
        self.label_delimiter = label_delimiter
        if self.labels_csv is not None:  # image files listed by the CSV, relative to root or to its folder
            self.root = Path(root) if root is not None else self.labels_csv.parent
            self.embedded, self._streamed = False, None
        # room: multilabel end
        self._streamed_root = str(root) if self._streamed is not None else None
        if self._streamed is not None:
            format_module(self._streamed).check_options(
                cache=cache,  # room: cache
                balance=balance,  # room: recipes
            )
        self.val_split = val_split
        self.split_seed = split_seed
        self.expected_num_classes = num_classes
        self.image_size = image_size
        self.crop_ratio = crop_ratio
        self.interpolation = interpolation
        self.train_transform = train_transform(image_size, scale, ratio, hflip, auto_augment, interpolation)
        # room: cache begin
        self.train_batch_transform = BatchAugment(
            image_size, scale, ratio, hflip, auto_augment, interpolation
        )
        require(batch_augment in (True, False), "data.batch_augment", batch_augment, "true or false")
        self.batch_augment = batch_augment
        # room: cache end
        self.eval_transform = eval_transform(image_size, crop_ratio, interpolation)
        self.batch_size = batch_size
        self.num_workers = default_num_workers() if num_workers is None else num_workers
        self.prefetch_factor = prefetch_factor
        require(
            isinstance(loader_timeout, int) and loader_timeout >= 0,
            "data.loader_timeout",
            loader_timeout,
            "whole seconds, at least 0 (0: wait forever)",
        )
        self.loader_timeout = loader_timeout
        self.skip_bad_images = skip_bad_images
        self.predict_dir = Path(predict_dir) if predict_dir is not None else None
        # room: cache begin
        require(cache in (True, False, "auto"), "data.cache", cache, "true, false or auto")
        self.cache = cache
        # room: cache end
        # room: recipes begin
        self.mixup_alpha = mixup_alpha
        self.cutmix_alpha = cutmix_alpha
        self.balance = balance
        self.batch_mix: BatchMix | None = None  # made at setup, when the number of classes is known
        # room: recipes end
        # room: cache begin
        self.decoded: dict[str, DecodedImages] = {}  # by split, kept across stages of one process
        # room: cache end
        self.datasets: dict[str, Dataset] = {}
        self.skip_log: SkipLog | None = None

    # ---- classes and splits (found on first use, so `predict` never needs the training data) ----

    @cached_property
    def splits(self) -> dict[str, ImageIndex]:
        """The labelled indices by split name: train, val and, when present, test."""
        splits = self._read_splits(partial(hold_out, fraction=self.val_split, seed=self.split_seed))
        self._check_num_classes(splits["train"].class_names)
        return splits

    def _read_splits(self, hold: HoldOut) -> Splits:
        """The splits as the data format stores them, `hold` giving one without val its split; the demo
        data sets are generated on first use. Each data format is one function returning the splits
        (docs/new-task.md, "Another data format")."""
        if self._streamed is not None:
            kind = format_module(self._streamed).KIND
            raise UserError(
                f"--data.root '{self._streamed_root}' holds {kind}: fit, validate, test and export read "
                "them, this command reads image files"
                " (folders or a labels CSV)"  # room: multilabel
                ".",
                f"point --data.root at the images the {kind} were made from "
                f"({self.source.made_from or 'the image folder they were made from'}).",
            )
        if self.embedded:
            shapes = "the embedded shapes data set (6 classes, 4,800 train and 600 val images)"
            _say_once_generated(self.root, shapes)
            generate_shapes(self.root)
        # room: multilabel begin
        if self.labels_csv == EMBEDDED_MULTILABEL_CSV:
            multishapes = "the embedded multi-label shapes (4,000 train and 400 val images)"
            _say_once_generated(EMBEDDED_MULTILABEL_CSV.parent, multishapes)
            generate_multishapes(EMBEDDED_MULTILABEL_CSV.parent)
        if self.labels_csv is not None:
            return csv_splits(self.labels_csv, self.root, self.label_delimiter, hold)
        # room: multilabel end
        return folder_splits(self.root, hold)

    def _check_num_classes(self, found: tuple[str, ...]) -> None:
        fewest = 2  # softmax over one class: nothing to learn
        # room: multilabel begin
        if self.labels_csv is not None:
            fewest = 1  # a sigmoid per label: one label can be learnt
        # room: multilabel end
        if len(found) < fewest:
            raise UserError(
                f"'{self._where}' has {len(found)} class folder{'' if len(found) == 1 else 's'} "
                f"{list(found)}: a classifier needs at least 2 classes.",
                "put each class's images in its own sub-folder (root/<class>/*.jpg, or train/ and val/ "
                "with the same class folders).",
            )
        if self.expected_num_classes is not None and self.expected_num_classes != len(found):
            raise UserError(
                f"--data.num_classes={self.expected_num_classes}, but '{self._where}' has "
                f"{len(found)} class folders {list(found)}.",
                "remove --data.num_classes (the number of classes is taken from the folders) "
                "or fix the folders.",
            )

    @cached_property
    def source(self) -> DataSource:
        """The data format's answers (data/source.py): a streamed format's, or image files split by one."""
        if self._streamed is not None:
            streamed = format_module(self._streamed).source(self._streamed_root)
            self._check_num_classes(streamed.class_names)
            return streamed
        return FileSource(
            self.splits,
            self._files,
            self.decoded,  # room: cache
        )

    @property
    def _where(self) -> str:
        """The data as given, for messages (an s3:// URL kept whole: a Path would fold its '//')."""
        return self._streamed_root or str(self.root)

    @property
    def _files(self) -> str:
        """Where the image files are found, for messages: the data folder."""
        # room: multilabel begin
        if self.labels_csv is not None:  # or the CSV that lists them
            return str(self.labels_csv)
        # room: multilabel end
        return str(self.root)

    def source_here(self) -> DataSource:
        """The source when its data is on this machine (or in a bucket); ValueError saying why not."""
        if self._streamed is None and not self.root.is_dir():
            raise ValueError(f"the data folder '{self.root}' is not on this machine")
        return self.source

    @property
    def class_names(self) -> list[str]:
        return list(self.source.class_names)

    # room: multilabel begin
    @property
    def task(self) -> str:
        """multiclass (one class folder per image) or multilabel (labels from a CSV); linked to the model."""
        if self._streamed is not None:
            return self.source.task  # the format's own record of it
        return "multilabel" if self.labels_csv is not None else "multiclass"

    # room: multilabel end

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    # room: recipes begin
    @property
    def class_weights(self) -> list[float] | None:
        """With balance=loss, each class's weight in the loss: total / (classes x its training images),
        so that every class weighs as much in total (sklearn's "balanced"); linked to the model."""
        if self.balance != "loss":
            return None
        train = self.source.class_counts("train")
        counts = np.maximum(np.array([train[name] for name in self.class_names]), 1)
        return (counts.sum() / (len(counts) * counts)).tolist()

    # room: recipes end
    # ---- Lightning hooks ----

    @override
    def setup(self, stage: str) -> None:
        if self.skip_bad_images and self.trainer is not None and self.trainer.log_dir is not None:
            self.skip_log = SkipLog(Path(self.trainer.log_dir))
        if self._streamed is not None and stage != "predict":  # predict reads files: no bucket needed
            self._setup_streamed(stage)
            return
        if stage == "fit":
            # room: recipes begin
            if self.mixup_alpha > 0 or self.cutmix_alpha > 0:
                self.batch_mix = BatchMix(self.mixup_alpha, self.cutmix_alpha, self.num_classes)
            # room: recipes end
            # room: cache begin
            cache = self._decide_cache() if self.cache == "auto" else self.cache
            self._decode("train", cache)
            # room: cache end
            self.datasets["train"] = self._labelled("train", self.train_transform)
            self.datasets["train"] = self._batch_augmented(self.datasets["train"])  # room: cache
            self._decode("val", cache)  # room: cache
            self.datasets["val"] = self._labelled("val", self.eval_transform)
        elif stage == "validate":
            self._decode("val", self.cache is True)  # room: cache
            self.datasets["val"] = self._labelled("val", self.eval_transform)
        elif stage == "test":
            if "test" not in self.splits:
                warnings.warn(
                    f"'{self.root}' has no test/ folder: testing on the validation split.", stacklevel=2
                )
            split = "test" if "test" in self.splits else "val"
            self._decode(split, self.cache is True)  # room: cache
            self.datasets["test"] = self._labelled(split, self.eval_transform)
        elif stage == "predict":
            self.datasets["predict"] = self._predict_dataset()

    def _setup_streamed(self, stage: str) -> None:
        """A streamed format's splits as its own data sets, with the same transforms as image files."""
        self._check_model_classes()
        source = self.source

        def split(name: str, transform: torch.nn.Module, shuffle: bool = False) -> Dataset:
            # the shuffle's seed is --data.split_seed, fixed: a resumed run (even one with a random
            # --seed_everything) must draw the killed run's order for the loader's saved position to apply
            return source.dataset(name, transform, shuffle, self.split_seed, self.skip_bad_images)

        if stage == "fit":
            # room: recipes begin
            if self.mixup_alpha > 0 or self.cutmix_alpha > 0:
                self.batch_mix = BatchMix(self.mixup_alpha, self.cutmix_alpha, self.num_classes)
            # room: recipes end
            self.datasets["train"] = split("train", self.train_transform, shuffle=True)
            self.datasets["val"] = split("val", self.eval_transform)
        elif stage == "validate":
            self.datasets["val"] = split("val", self.eval_transform)
        elif stage == "test":
            if "test" not in source.split_names:
                warnings.warn(
                    f"'{source.where}' has no test split: testing on the validation split.", stacklevel=2
                )
            self.datasets["test"] = split(
                "test" if "test" in source.split_names else "val", self.eval_transform
            )

    # room: cache begin
    def _decide_cache(self) -> bool:
        """--data.cache=auto: cache small images that fit comfortably in memory (data/cache.py's rule).

        Under DDP every process holds its own copy, so the budget counts this machine's processes;
        the first process decides for all (their free memory differs by what the others took).
        """
        trainer = self.trainer
        processes = trainer.num_devices if trainer is not None else 1
        if trainer is None or trainer.is_global_zero:
            decision = auto_cache([self.splits["train"], self.splits["val"]], processes)
            if decision.enabled:
                print(decision.notice)
            enabled = decision.enabled
        else:
            enabled = False
        return bool(trainer.strategy.broadcast(enabled, src=0)) if trainer is not None else enabled

    def _decode(self, split: str, cache: bool) -> None:
        """With `cache`, the split decoded into memory (once per process), where its data set reads it."""
        self._check_model_classes()
        if cache and split not in self.decoded:
            self.decoded[split] = decode_all(
                self.splits[split], split, self.num_workers, self.skip_bad_images, self.skip_log
            )

    def _batch_augmented(self, dataset: ImageDataset) -> Dataset:
        """The training split: augmented a batch at a time when cached with one small image size.

        Small: at most batch_augment.MAX_PIXELS an image, where it was measured to pay.
        """
        decoded = self.decoded.get("train")
        shape = uniform_shape(decoded) if decoded is not None else None
        if self.batch_augment and shape is not None and shape[1] * shape[2] <= MAX_PIXELS:
            if self.trainer is None or self.trainer.is_global_zero:
                print("Augmenting the cached training images a batch at a time (--data.batch_augment).")
            return CachedBatches(dataset.index, decoded, self.train_batch_transform)
        return dataset

    # room: cache end
    def _labelled(self, split: str, transform: torch.nn.Module) -> ImageDataset:
        """The split's data set."""
        self._check_model_classes()
        return ImageDataset(
            self.splits[split],
            transform,
            self.skip_bad_images,
            self.skip_log,
            self.decoded.get(split),  # room: cache
        )

    def _check_model_classes(self) -> None:
        """A checkpoint's classes must be the data's classes, in the same order."""
        model = self.trainer.lightning_module if self.trainer is not None else None
        model_names = getattr(model, "class_names", None) if model is not None else None
        # room: multilabel begin
        model_task = getattr(model, "task", self.task) if model is not None else self.task
        if model_task != self.task:
            raise UserError(
                f"The model is {model_task}, but the data is {self.task} "
                f"({'--data.labels_csv' if self.labels_csv else 'class folders'}).",
                "evaluate a multi-label model on a labels CSV, a multi-class one on class folders.",
            )
        # room: multilabel end
        if model_names is not None and list(model_names) != self.class_names:
            raise UserError(
                f"The model was trained on classes {list(model_names)}, "
                f"but '{self.source.where}' has {self.class_names}.",
                "evaluate on data with the same class folders, or train a new model on this data.",
            )

    def _predict_dataset(self) -> FileDataset:
        if self.predict_dir is None:
            raise UserError("predict needs a folder of images.", "pass --data.predict_dir=PATH.")
        if not self.predict_dir.is_dir():
            raise UserError(
                f"--data.predict_dir '{self.predict_dir}' is not a folder.", "pass a folder of images."
            )
        files = [self.predict_dir / f for f in list_images(self.predict_dir)]
        if not files:
            raise UserError(
                f"--data.predict_dir '{self.predict_dir}' has no images.", "point it at image files."
            )
        model = self.trainer.lightning_module if self.trainer is not None else None
        image_size = (
            getattr(model, "image_size", None) or self.image_size
        )  # the size the model was trained at
        return FileDataset(
            files,
            eval_transform(image_size, self.crop_ratio, self.interpolation),
            self.skip_bad_images,
            self.predict_dir,
            self.skip_log,
        )

    @override
    def teardown(self, stage: str) -> None:
        if self.skip_log is not None and self.trainer is not None and self.trainer.is_global_zero:
            report, count = self.skip_log.merge()
            if count:
                warnings.warn(
                    f"{count} unreadable files were skipped; they are listed in '{report}'.",
                    stacklevel=2,
                )

    @override
    def train_dataloader(self) -> DataLoader:
        return self._loader(self.datasets["train"], train=True)

    @override
    def val_dataloader(self) -> DataLoader:
        return self._loader(self.datasets["val"])

    @override
    def test_dataloader(self) -> DataLoader:
        return self._loader(self.datasets["test"])

    @override
    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.datasets["predict"])

    # room: recipes begin
    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """MixUp/CutMix training batches on the device (evaluation and prediction see real images)."""
        if self.batch_mix is None or batch is None or self.trainer is None or not self.trainer.training:
            return batch
        images, labels = batch
        return self.batch_mix(images, labels)

    def _balanced_sampler(self, dataset: Dataset) -> Sampler:
        """Each training image drawn with probability 1 / (its class's count): every class equally often.

        Under DDP Lightning wraps it (DistributedSamplerWrapper): each process draws its own sample of
        the same size and keeps its share, so an epoch is still len(train) images across processes.
        """
        labels = self.splits["train"].labels
        counts = np.bincount(labels, minlength=self.num_classes)
        weights = torch.as_tensor(1.0 / counts[labels], dtype=torch.double)
        return WeightedRandomSampler(weights, num_samples=len(dataset), replacement=True)

    # room: recipes end
    def _loader(self, dataset: Dataset, train: bool = False) -> DataLoader:
        on_gpu = self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)
        if isinstance(dataset, IterableDataset):  # a streamed format's (predict reads files)
            return self.source.loader(
                dataset,
                self.batch_size,
                train,
                num_workers=self.num_workers,
                pin_memory=on_gpu,
                prefetch_factor=self.prefetch_factor if self.num_workers > 0 else None,
                timeout=self.loader_timeout if self.num_workers > 0 else 0,
                collate_fn=self._collate(dataset),
                worker_init_fn=worker_init,
            )
        sampler: Sampler | None = None  # training: shuffled
        # room: recipes begin
        if train and self.balance == "sampler":
            sampler = self._balanced_sampler(dataset)
        # room: recipes end
        if (
            not train
            and self.trainer is not None
            and self.trainer.world_size > 1
            and not isinstance(self.trainer.strategy, FSDPStrategy)  # every FSDP forward is collective
        ):
            # evaluation counts every image once; Lightning's DistributedSampler would pad with repeats
            world, rank = self.trainer.world_size, self.trainer.global_rank
            sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        if self.num_workers > 0 and hasattr(dataset, "reads"):
            dataset.reads = WorkerReads(self.num_workers)  # what each worker reads, named if it stalls
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            timeout=self.loader_timeout if self.num_workers > 0 else 0,
            shuffle=train and sampler is None,
            sampler=sampler,
            drop_last=train and len(dataset) > self.batch_size,  # no 1-image batch for BatchNorm
            num_workers=self.num_workers,
            pin_memory=on_gpu,
            persistent_workers=self.num_workers > 0,
            # DataLoader refuses a prefetch factor without workers: there is nothing to prefetch with
            prefetch_factor=self.prefetch_factor if self.num_workers > 0 else None,
            collate_fn=self._collate(dataset),
            # the workers outlive a SIGTERM/SIGINT to the process group, so GracefulStop can save
            worker_init_fn=worker_init,
        )

    def stalled_reads(self) -> list[str]:
        """What each loader worker was reading when a loader timed out: '<split>: worker N: <file>'."""
        found = []
        for split, dataset in self.datasets.items():
            reads = getattr(dataset, "reads", None)
            if reads is not None:
                found += [f"{split}: worker {w}: '{path}'" for w, path in reads.reading().items()]
        return found

    def _collate(self, dataset: Dataset) -> Any:
        # room: cache begin
        if isinstance(dataset, CachedBatches):
            return whole_batch
        # room: cache end
        return collate_skipping_none if self.skip_bad_images else default_collate


def _say_once_generated(root: Path, what: str) -> None:
    """The one line a first run prints before it draws an embedded data set (rank 0; a few seconds)."""
    if not root.exists() and rank_zero_only.rank == 0:
        print(f"Generating {what} in {root}/ (once; later runs reuse it).", flush=True)
