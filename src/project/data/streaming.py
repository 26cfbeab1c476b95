"""ShardDataset: a split of shards (data/shards.py) streamed by LitData, with the template's transforms.

Imported only when shards are used: litdata is an optional install (the `shards` extra).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from litdata import StreamingDataset
from typing_extensions import override

from project.data.decode import BadImageError, decode_chw
from project.data.shards import allow_plain_http, is_url
from project.terminal import printable


class ShardDataset(StreamingDataset):
    """(image, label) pairs of one split of shards, decoded from the stored bytes and transformed.

    LitData shards by rank and worker, shuffles across chunks (per epoch, from `seed`) and keeps its
    position in `state_dict`, which StreamingDataLoader saves in the checkpoint.

    Args:
        url: The split's folder or s3:// URL (LitData's index.json and chunks).
        transform: uint8 [3, H, W] to the model's input, as for image files.
        shuffle: Shuffle (training) or read in order (evaluation).
        seed: The shuffle's seed.
        with_ids: Return (image, label, id) with the sample's position in its split (tests, debugging).
        skip_bad_images: A sample whose bytes cannot be decoded yields None (with a warning) instead of
            stopping; the loader's collate_skipping_none leaves it out of its batch.
    """

    def __init__(
        self,
        url: str,
        transform: Callable[[torch.Tensor], torch.Tensor],
        shuffle: bool,
        seed: int = 42,
        with_ids: bool = False,
        skip_bad_images: bool = False,
    ) -> None:
        # training: LitData drops the remainder under DDP (every rank the same number of batches, or the
        # gradient all-reduce waits forever); evaluation: every sample, uneven shares are fine there
        if is_url(url):
            allow_plain_http()  # LitData downloads chunks through obstore too
        super().__init__(url, shuffle=shuffle, seed=seed, drop_last=None if shuffle else False)
        # not `transform`: StreamingDataset applies its own `self.transform` to the stored dict
        self.image_transform = transform
        self.with_ids = with_ids
        self.skip_bad_images = skip_bad_images
        self.url = url

    @override
    def __getitem__(self, index: Any) -> tuple[Any, ...] | None:
        sample = super().__getitem__(index)
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
        label = torch.from_numpy(np.asarray(label, dtype=np.uint8)) if np.ndim(label) else int(label)
        return (image, label, int(sample["id"])) if self.with_ids else (image, label)
