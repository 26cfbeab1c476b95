"""The shards' data source: splits of shards (data/shards.py) streamed by LitData, with the template's
transforms.

Imported only when shards are used: litdata is an optional install (the `shards` extra). Every split is
checked (data/shard_checks.py) before LitData reads it, and every sample's values as it is read.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.resolver import Dir
from litdata.utilities.dataset_utilities import get_default_cache_dir
from PIL import Image
from torch.utils.data import Dataset, Subset
from typing_extensions import override

from project.atomic import atomic_write
from project.data.decode import BadImageError, decode_chw
from project.data.index import IMAGE_EXTENSIONS
from project.data.shard_checks import FIELDS, CheckedSplit, check_split
from project.data.shards import allow_plain_http, damaged, is_url, read_index
from project.data.source import evenly_spaced

# room: multilabel begin
from project.model import is_multilabel

# room: multilabel end
from project.terminal import printable

MAX_PATH_CHARS = 4096
SAFE_NAME = re.compile(r"[^\w.-]")  # a stored file name, written as a name of one folder's


def bucket_cache(split: CheckedSplit) -> str:
    """The local folder LitData downloads a bucket split's chunks into, holding the index as checked.

    Named after the URL and the checked index's hash, and given that index before LitData starts: LitData
    then reads the index that was checked instead of downloading it again (a bucket may change between).
    """
    base = os.environ.get("LITDATA_CACHE_DIR") or get_default_cache_dir()
    url_hash = hashlib.sha256(split.url.encode()).hexdigest()[:32]
    folder = Path(base) / url_hash / hashlib.sha256(split.index).hexdigest()[:32]
    index = folder / "index.json"
    if not index.is_file() or index.read_bytes() != split.index:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(index, split.index)
    return str(folder)


class ShardDataset(StreamingDataset):
    """(image, label) pairs of one checked split of shards, decoded from the stored bytes and transformed.

    LitData shards by rank and worker, shuffles across chunks (per epoch, from `seed`) and keeps its
    position in `state_dict`, which StreamingDataLoader saves in the checkpoint.

    Args:
        split: The split, checked by shard_checks.check_split.
        task: multiclass
            or multilabel  # room: multilabel
            (shards.json's).
        num_classes: The number of classes (shards.json's): labels are checked against it.
        transform: uint8 [3, H, W] to the model's input, as for image files.
        shuffle: Shuffle (training) or read in order (evaluation).
        seed: The shuffle's seed.
        with_ids: Return (image, label, id) with the sample's position in its split (tests, debugging).
        skip_bad_images: A sample whose bytes cannot be decoded yields None (with a warning) instead of
            stopping; the loader's collate_skipping_none leaves it out of its batch.
    """

    def __init__(
        self,
        split: CheckedSplit,
        task: str,
        num_classes: int,
        transform: Callable[[torch.Tensor], torch.Tensor],
        shuffle: bool,
        seed: int = 42,
        with_ids: bool = False,
        skip_bad_images: bool = False,
    ) -> None:
        url = split.url
        if is_url(url):
            allow_plain_http()  # LitData downloads chunks through obstore too
            source: str | Dir = Dir(path=bucket_cache(split), url=url)
        else:
            source = url
        # training: LitData drops the remainder under DDP (every rank the same number of batches, or the
        # gradient all-reduce waits forever); evaluation: every sample, uneven shares are fine there
        super().__init__(source, shuffle=shuffle, seed=seed, drop_last=None if shuffle else False)
        # not `transform`: StreamingDataset applies its own `self.transform` to the stored dict
        self.image_transform = transform
        self.with_ids = with_ids
        self.skip_bad_images = skip_bad_images
        self.url = url
        self.task = task
        self.num_classes = num_classes
        self.ids = split.ids

    @override
    def __getitem__(self, index: Any) -> tuple[Any, ...] | None:
        sample = self.read(index)
        # the message names the shard sample and the file it was made from
        name = f"{self.url} sample {sample['id']} ({sample['path']})"
        try:
            image = self.image_transform(decode_chw(bytes(sample["image"]), name))
        except BadImageError as e:
            if not self.skip_bad_images:
                raise
            warnings.warn(f"Skipped a bad image: {printable(str(e))}", stacklevel=2)
            return None
        label = sample["label"]
        # room: multilabel begin
        if is_multilabel(self):  # a 0/1 row, as a labels CSV's images give it
            label = torch.from_numpy(np.asarray(label, dtype=np.uint8))
        # room: multilabel end
        return (image, label, sample["id"]) if self.with_ids else (image, label)

    def read(self, index: Any) -> dict[str, Any]:
        """The stored sample at `index`, its values checked; one UserError for a damaged chunk or value."""
        position = getattr(index, "index", index)
        where = f"{self.url} (sample at position {position})"
        try:
            sample = super().__getitem__(index)
        except (BadImageError, KeyboardInterrupt):
            raise
        except Exception as e:  # LitData's own errors on damaged chunk bytes: struct, value, assertion, ...
            raise damaged(where, f"its sample cannot be read ({type(e).__name__}: {e})") from None
        if not (isinstance(sample, dict) and tuple(sample) == FIELDS):
            raise damaged(where, f"it holds {type(sample).__name__}; expected the fields {list(FIELDS)}")
        if not isinstance(sample["image"], bytes | bytearray | memoryview):
            raise damaged(where, "its image is not bytes")
        sample_id, path = sample["id"], sample["path"]
        if not (isinstance(sample_id, int) and 0 <= sample_id < self.ids):
            raise damaged(where, f"its id is {sample_id!r}; expected 0..{self.ids - 1}")
        if not (isinstance(path, str) and len(path) <= MAX_PATH_CHARS):
            raise damaged(where, "its file path is not a string of at most 4,096 characters")
        self._check_label(sample["label"], f"{self.url} sample {sample_id} ({path})")
        return sample

    def _check_label(self, label: Any, where: str) -> None:
        ok = isinstance(label, int) and 0 <= label < self.num_classes
        expected = f"a class 0..{self.num_classes - 1} (shards.json names {self.num_classes} classes)"
        # room: multilabel begin
        if is_multilabel(self):
            ok = (
                isinstance(label, np.ndarray)
                and label.shape == (self.num_classes,)
                and label.dtype == np.uint8
                and int(label.max(initial=0)) <= 1
            )
            expected = f"a 0/1 row of {self.num_classes} labels"
        # room: multilabel end
        if not ok:
            shown = label.tolist() if isinstance(label, np.ndarray) else label
            raise damaged(where, f"its label is {printable(repr(shown))[:80]}; expected {expected}")


class ShardSource:
    """The shards at `root` (a folder with shards.json, or an s3:// URL) as the data module's source.

    shards.json is read and checked at once (class names, task, counts); each split's LitData index
    when the split is first used.
    """

    def __init__(self, root: str) -> None:
        self.where = root
        self.record = read_index(root)
        self.task = self.record.task
        self.class_names = self.record.class_names
        self.split_names = tuple(self.record.splits)
        self.made_from = self.record.source  # None when optimize did not record it
        self._checked: dict[str, CheckedSplit] = {}

    def class_counts(self, split: str) -> dict[str, int]:
        return dict(self.record.splits[split].class_counts)

    def count(self, split: str) -> int:
        return self.record.splits[split].count

    def labels(self, split: str) -> None:
        return None  # checked as each sample is read (ShardDataset.read)

    def checked(self, split: str) -> CheckedSplit:
        if split not in self._checked:
            self._checked[split] = check_split(self.where, split, self.record)
        return self._checked[split]

    def dataset(
        self, split: str, transform: Callable, shuffle: bool, seed: int, skip_bad_images: bool
    ) -> ShardDataset:
        """The split as a streaming data set (training: shuffle=True)."""
        return ShardDataset(
            self.checked(split), self.task, len(self.class_names), transform, shuffle, seed,
            skip_bad_images=skip_bad_images,
        )  # fmt: skip

    def samples(self, split: str, count: int, transform: Callable, skip_bad_images: bool) -> Dataset:
        """Up to `count` samples of `split`, evenly spaced in the stored (seeded random) order."""
        data = self.dataset(split, transform, shuffle=False, seed=0, skip_bad_images=skip_bad_images)
        return Subset(data, evenly_spaced(len(data), count))

    def image_sizes(self, split: str, count: int) -> list[tuple[int, int]]:
        """(width, height) of up to `count` samples of `split`, read from their headers."""
        data = self.dataset(split, lambda image: image, shuffle=False, seed=0, skip_bad_images=True)
        sizes = []
        for i in evenly_spaced(len(data), count):
            try:
                with Image.open(io.BytesIO(bytes(data.read(i)["image"]))) as image:
                    sizes.append(image.size)
            except OSError:
                continue  # reported by the loader, with the sample's name
        return sizes

    def extract(self, folder: Path) -> None:
        """Write every sample's image as a file, `folder/<split>/<class>/<id>-<file name>` (multiclass), for
        the commands that read image folders (`audit`). Each sample is checked as it is read."""
        for split in self.split_names:
            data = self.dataset(split, lambda image: image, shuffle=False, seed=0, skip_bad_images=True)
            for i in range(len(data)):
                sample = data.read(i)
                name = SAFE_NAME.sub("_", os.path.basename(sample["path"]))[-100:]
                if os.path.splitext(name)[1].lower() not in IMAGE_EXTENSIONS:
                    name += ".jpg"  # listed as an image; decoding reads the bytes' own format
                target = folder / split / self.class_names[sample["label"]] / f"{sample['id']:07d}-{name}"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(bytes(sample["image"]))

    def loader(
        self, dataset: ShardDataset, batch_size: int, train: bool, **options: Any
    ) -> StreamingDataLoader:
        """LitData's loader: it shards by rank and worker itself and has a state_dict, which Lightning saves
        in the checkpoint and restores on --ckpt_path (resuming mid-epoch).

        A training split smaller than a batch still gives its one batch, as image folders do; a last
        short batch is dropped only when there are more (no 1-image batch for BatchNorm).
        """
        return StreamingDataLoader(
            dataset, batch_size=batch_size, drop_last=train and len(dataset) > batch_size, **options
        )
