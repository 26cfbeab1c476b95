"""A split of shards is read only when its LitData files are exactly what `optimize` writes.

LitData reads each field of a sample with the serializer that the split's `index.json` names
(`config.data_format`: some of LitData's serializers unpickle), rebuilds the sample from a pytree spec
that can name a module to import and a function to call (`config.data_spec`), and derives the paths it
downloads, locks and counts from the chunk names in the index. A shards folder or bucket is data that
people hand around, so before a `StreamingDataset` is made every split's index is checked here:

- the config is the one `optimize` writes for the task (LitData's own writer makes the expected one):
  the exact `data_format` list, the exact `data_spec`, no compression, no encryption, PyTreeLoader;
- each chunk is named `chunk-<worker>-<n>.bin` (no separator, no `..`, not absolute), holds at least
  one sample, and the chunks add up to the split's count in shards.json;
- each chunk file is there with the size the index gives (a local chunk's header is read too: its
  sample count and offsets), so a missing or cut chunk is one message, not a wait for a download.

Each sample's values (label in range, id, path) are checked as it is read (data/streaming.py).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from project.data.shards import (
    CHUNK_BYTES,
    ShardsRecord,
    damaged,
    is_url,
    join,
    object_sizes,
    read_bytes,
)

# room: multilabel begin
from project.model import is_multilabel

# room: multilabel end

CHUNK_NAME = re.compile(r"chunk-[0-9]{1,9}-[0-9]{1,9}\.bin")  # litdata.optimize's chunk-<worker>-<n>.bin
UPDATED_AT = re.compile(r"[0-9]{1,20}(\.[0-9]{1,20})?")
CHUNK_KEYS = {"chunk_bytes", "chunk_size", "dim", "filename"}
FIELDS = ("image", "label", "id", "path")  # the order of optimize's sample dict, and of data_format


@dataclass(frozen=True)
class Chunk:
    name: str
    samples: int
    size: int


@dataclass(frozen=True)
class CheckedSplit:
    """A split whose index.json was checked: its URL, the index's bytes as checked, its chunks, and the
    bound of its sample ids (count + files left out as bad)."""

    url: str
    index: bytes
    chunks: tuple[Chunk, ...]
    ids: int


def template_sample(
    num_classes: int,
    multilabel: bool = False,  # room: multilabel
) -> dict[str, Any]:
    """A sample as `optimize` stores it (the types matter, not the values)."""
    label: Any = 0
    label = np.zeros(num_classes, dtype=np.uint8) if multilabel else label  # room: multilabel
    return {"image": b"", "label": label, "id": 0, "path": ""}


@cache
def expected_config(
    num_classes: int,
    multilabel: bool = False,  # room: multilabel
) -> dict[str, Any]:
    """The `config` LitData's writer records for optimize's samples (less `types`, which it never reads)."""
    from litdata.streaming.writer import BinaryWriter

    with tempfile.TemporaryDirectory() as folder:
        writer = BinaryWriter(folder, chunk_bytes=CHUNK_BYTES)
        writer.serialize(
            template_sample(
                num_classes,
                multilabel,  # room: multilabel
            )
        )
        config = writer.get_config()
    config.pop("types", None)
    return config


def check_split(root: str, split: str, record: ShardsRecord) -> CheckedSplit:
    """Split `split` of the shards at `root`, checked against what optimize writes; UserError if not."""
    url = join(root, split)
    where = join(url, "index.json")
    raw = read_bytes(where, f"the {split} split's LitData index (index.json)")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise damaged(where, f"it is not JSON ({e})") from None
    if not isinstance(data, dict) or set(data) - {"updated_at"} != {"chunks", "config"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise damaged(where, f"it holds {keys}; expected chunks, config and updated_at")
    updated = data.get("updated_at", "0")
    if not (isinstance(updated, str) and UPDATED_AT.fullmatch(updated)):
        raise damaged(where, f"'updated_at' is {updated!r}; expected a time stamp such as \"1796521697.5\"")
    _check_config(data["config"], where, record)
    chunks = _check_chunks(data["chunks"], where)
    expected = record.splits[split].count
    if sum(c.samples for c in chunks) != expected:
        raise damaged(
            where,
            f"its chunks hold {sum(c.samples for c in chunks)} samples, but shards.json counts {expected} "
            f"in the {split} split",
        )
    if is_url(url):
        _check_objects(url, chunks)
    else:
        for chunk in chunks:
            _check_chunk_file(join(url, chunk.name), chunk)
    return CheckedSplit(url, raw, chunks, expected + record.splits[split].skipped)


def _check_config(config: Any, where: str, record: ShardsRecord) -> None:
    expected = expected_config(
        len(record.class_names),
        is_multilabel(record),  # room: multilabel
    )
    if not isinstance(config, dict):
        raise damaged(where, f"'config' is {type(config).__name__}; expected the object optimize writes")
    formats, wanted = config.get("data_format"), expected["data_format"]
    if not (isinstance(formats, list) and len(formats) == len(wanted)):
        raise damaged(where, f"'config.data_format' is {_shown(formats)}; expected {wanted}")
    for field, found, want in zip(FIELDS, formats, wanted, strict=True):
        if found != want:
            raise damaged(
                where, f"field '{field}' is stored as {_shown(found)}; optimize stores it as '{want}' "
                "(no other LitData serializer is read)",
            )  # fmt: skip
    if config.get("data_spec") != expected["data_spec"]:
        raise damaged(
            where, f"'config.data_spec' is {_shown(config.get('data_spec'))}; expected optimize's sample "
            f"layout {expected['data_spec']} (no other pytree node type is read)",
        )  # fmt: skip
    for key in sorted(set(config) | set(expected)):
        if key in ("types", "data_format", "data_spec"):
            continue
        if key not in expected or config.get(key) != expected[key]:
            raise damaged(
                where,
                f"'config.{key}' is {_shown(config.get(key))}; expected {_shown(expected.get(key))}",
            )
    types = config.get("types")
    if types is not None and not (isinstance(types, dict) and set(types) <= set(FIELDS)):
        raise damaged(where, f"'config.types' is {_shown(types)}; expected null or a type name per field")


def _check_chunks(chunks: Any, where: str) -> tuple[Chunk, ...]:
    if not (isinstance(chunks, list) and chunks):
        raise damaged(where, f"'chunks' is {_shown(chunks)}; expected a list of at least one chunk")
    found: list[Chunk] = []
    for i, entry in enumerate(chunks):
        if not (isinstance(entry, dict) and set(entry) == CHUNK_KEYS):
            raise damaged(
                where, f"chunk {i} is {_shown(entry)}; expected an object with {sorted(CHUNK_KEYS)}"
            )
        name, samples, size = entry["filename"], entry["chunk_size"], entry["chunk_bytes"]
        if not (isinstance(name, str) and CHUNK_NAME.fullmatch(name)):
            raise damaged(
                where, f"chunk {i} is named {_shown(name)}; expected a plain name such as 'chunk-0-0.bin' "
                "(no folder, no '..', not absolute)",
            )  # fmt: skip
        if not (_whole(samples) and samples >= 1):
            raise damaged(where, f"chunk '{name}' holds {_shown(samples)} samples; expected at least 1")
        if not (_whole(size) and size >= 4 * (samples + 2)):
            raise damaged(where, f"chunk '{name}' has {_shown(size)} bytes; too few for {samples} samples")
        if entry["dim"] is not None:
            raise damaged(where, f"chunk '{name}' has dim {_shown(entry['dim'])}; expected null")
        found.append(Chunk(name, samples, size))
    if len({c.name for c in found}) != len(found):
        raise damaged(where, "it names a chunk twice")
    return tuple(found)


def _check_chunk_file(path: str, chunk: Chunk) -> None:
    """The local chunk is a regular file of the index's size whose header agrees with it."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise damaged(path, "it is not a regular file")
        if info.st_size != chunk.size:
            raise damaged(
                path, f"it has {info.st_size:,} bytes, the index says {chunk.size:,} (cut or replaced)"
            )
        with open(path, "rb") as f:
            header = f.read(4 * (chunk.samples + 2))
    except FileNotFoundError:
        raise damaged(path, "the chunk named in its split's index.json is missing") from None
    except OSError as e:
        raise damaged(path, f"it cannot be read ({e.strerror or e})") from None
    values = np.frombuffer(header, dtype="<u4").astype(np.int64)
    count, offsets = int(values[0]), values[1:]
    if count != chunk.samples:
        raise damaged(path, f"its header counts {count} samples, the index {chunk.samples}")
    if offsets[0] != len(header) or offsets[-1] != chunk.size or np.any(np.diff(offsets) < 0):
        raise damaged(path, "its table of sample offsets does not match its size")


def _check_objects(url: str, chunks: tuple[Chunk, ...]) -> None:
    """Every chunk is an object of the index's size under the split's prefix."""
    sizes = object_sizes(url)
    for chunk in chunks:
        if chunk.name not in sizes:
            raise damaged(join(url, chunk.name), "the chunk named in its split's index.json is missing")
        if sizes[chunk.name] != chunk.size:
            raise damaged(
                join(url, chunk.name),
                f"it has {sizes[chunk.name]:,} bytes, the index says {chunk.size:,}",
            )


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
