"""Shards written in a test with LitData's own writer, laid out as `optimize` lays them out, so that a
test can damage or craft one file at a time (tests/test_shards_trust.py)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from PIL import Image
from typing_extensions import override

from project.data.datamodule import ImageDataModule
from project.data.shards import FORMAT, INDEX

Sample = dict[str, Any]


def jpeg(value: int, size: int = 16) -> bytes:
    """A small JPEG of one grey level."""
    out = io.BytesIO()
    Image.new("RGB", (size, size), (value, value, value)).save(out, "JPEG")
    return out.getvalue()


def samples(count: int, num_classes: int) -> list[Sample]:
    """`count` samples as optimize stores them: JPEG bytes, a class, the position, a path."""
    return [
        {
            "image": jpeg(40 * (i % num_classes)),
            "label": i % num_classes,
            "id": i,
            "path": f"c{i % num_classes}/{i}.jpg",
        }
        for i in range(count)
    ]


def write_split(folder: Path, items: Sequence[Sample]) -> None:
    """One split's chunks and index.json, by LitData's writer (what litdata.optimize calls)."""
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(folder), chunk_bytes="64MB")
    for i, item in enumerate(items):
        writer[i] = item
    writer.done()
    writer.merge(1)


def write_shards(
    root: Path, counts: dict[str, int] | None = None, num_classes: int = 3, task: str = "multiclass"
) -> Path:
    """Complete shards at `root`: each split's samples and a shards.json that agrees with them."""
    counts = counts or {"train": 12, "val": 6}
    names = [f"c{i}" for i in range(num_classes)]
    splits = {}
    for split, count in counts.items():
        items = samples(count, num_classes)
        write_split(root / split, items)
        per_class = np.bincount([item["label"] for item in items], minlength=num_classes).tolist()
        splits[split] = {"count": count, "class_counts": dict(zip(names, per_class, strict=True))}
    record = {
        "format": FORMAT,
        "task": task,
        "class_names": names,
        "splits": splits,
        "source": "",
        "max_side": None,
    }
    (root / INDEX).write_text(json.dumps(record))
    return root


def edit_json(path: Path, change: Callable[[Any], Any]) -> None:
    """Rewrite the JSON file at `path` with `change(data)`, which edits in place and returns None, or returns
    the new value (a str: the file's new text as it is)."""
    data = json.loads(path.read_text())
    changed = change(data)
    path.write_text(changed if isinstance(changed, str) else json.dumps(data if changed is None else changed))


class WithIds(ImageDataModule):
    """The real data module and loader; the training samples also carry their id (position in the split)."""

    @override
    def setup(self, stage: str) -> None:
        super().setup(stage)
        self.datasets["train"].with_ids = True


class Recorder(L.LightningModule):
    """A linear model on the mean colour that records the id of every sample it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 6)
        self.seen: list[int] = []

    @override
    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], index: int
    ) -> torch.Tensor:
        images, labels, ids = batch
        self.seen += ids.tolist()
        return torch.nn.functional.cross_entropy(self.linear(images.float().mean((2, 3))), labels)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)
