"""Shards: a data set optimized by LitData into chunks per split, on local disk or in an s3:// bucket.

    OUT/shards.json            what the template needs first: task, class names, counts per split
    OUT/train/ OUT/val/ [OUT/test/]   LitData's own `index.json` + `chunk-*.bin` per split

Each sample is {"image": the encoded file's bytes, "label": class (int) or multi-hot (uint8 array),
"id": the image's position in its split, "path": the file it was made from, relative to the split's
root}. The format is LitData's (`litdata.optimize`, `StreamingDataset`); the template adds only
shards.json, written last, so a folder that has it is complete. The endpoint and credentials of a
bucket come from the usual variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION or ~/.aws), as boto3 reads them.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace  # room: multilabel
from typing import Any, NoReturn

from project.atomic import atomic_write
from project.errors import UserError, missing_package

# room: multilabel begin
from project.model import is_multilabel

# room: multilabel end

INDEX = "shards.json"
# 2: samples in a seeded random order (format 1 wrote them in class order, which trains at chance)
FORMAT = 2
SPLITS = ("train", "val", "test")
# A bucket that cannot be reached is an error within seconds, not boto3's minutes of retries
CONNECT_TIMEOUT_S = 3
ATTEMPTS = 2
MAX_CLASSES = 100_000  # ImageNet-21k has 21,841: a file claiming more is not a data set
TASKS = (  # shards.json's `task`: the model's
    "multiclass",
    "multilabel",  # room: multilabel
)
CHUNK_BYTES = "64MB"  # LitData's advice for streaming from object storage: tens of MB per request
MAX_INDEX_BYTES = 256 * 2**20  # shards.json and a split's index.json: a few KB per thousand chunks


def litdata() -> Any:
    """The litdata module, an optional install (the `shards` extra)."""
    try:
        import litdata
    except ModuleNotFoundError:
        raise missing_package("Shards", "shards", "litdata boto3") from None
    return litdata


def is_url(root: str | Path) -> bool:
    return str(root).startswith("s3://")


def join(root: str | Path, *parts: str) -> str:
    """`root/parts...` for a folder or an s3:// URL (pathlib would fold the URL's `//`)."""
    return "/".join([str(root).rstrip("/"), *parts])


def s3_client() -> Any:
    """A boto3 client with the environment's endpoint and credentials and short timeouts."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=30,
        retries={"max_attempts": ATTEMPTS, "mode": "standard"},
    )
    return boto3.client("s3", config=config)


def bucket_key(url: str) -> tuple[str, str]:
    bucket, _, key = url.removeprefix("s3://").partition("/")
    return bucket, key


def s3_problem(url: str, error: Exception) -> UserError:
    """One line for any failure to reach or read a bucket (boto3 raises many types)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or "AWS"
    return UserError(
        f"Cannot read '{url}' at {endpoint}: {type(error).__name__}: {error}".replace("\n", " "),
        "check the bucket name, AWS_ENDPOINT_URL and the credentials (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY), and that the server is up.",
    )


KIND = "shards"


def holds(root: str | Path) -> bool:
    """Whether `root` holds shards (source.STREAMED's question): a folder with shards.json, or a URL."""
    return has_index(root)


def check_options(
    cache: bool | str = False,  # room: cache
    balance: str = "none",  # room: recipes
) -> None:
    """Options that need the whole split in this process's hands: not for streamed shards."""
    # room: cache begin
    if cache is True:
        raise UserError(
            "--data.cache=true: shards are streamed, not decoded into memory up front.",
            "remove --data.cache (LitData keeps the chunks it reads on local disk).",
        )
    # room: cache end
    # room: recipes begin
    if balance == "sampler":
        raise UserError(
            "--data.balance=sampler draws images by index, which streamed shards do not allow.",
            "use --data.balance=loss (class weights from the counts in the shard index).",
        )
    # room: recipes end


def source(root: str | Path) -> Any:
    """The shards at `root` as the data module's source (data/streaming.py's ShardSource)."""
    litdata()  # installed, or one line saying how
    from project.data.streaming import ShardSource

    return ShardSource(str(root))


def has_index(root: str | Path) -> bool:
    """Whether `root` is a shards folder or URL (it has shards.json); a folder of images is not."""
    if is_url(root):
        return True  # only shards are read from a bucket; read_index says what is wrong with one
    if (Path(root) / INDEX).is_file():
        return True
    started = [split for split in SPLITS if any((Path(root) / split).glob("*index.json"))]
    if started:
        raise UserError(
            f"'{root}' holds shards that `optimize` did not finish: {', '.join(started)} written, no {INDEX} "
            "(it is written last, when every split is complete).",
            "run optimize again into a new folder (or delete this one first): a stopped optimize does not "
            "resume.",
        )
    return False


def read_bytes(url: str, what: str) -> bytes:
    """The bytes of file `url` (a path, or an s3:// object); one UserError when it is missing or unreadable.

    `what` says where the file belongs, for the message ("the shard index of '<root>'", ...).
    """
    if is_url(url):
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = bucket_key(url)
        try:
            return bytes(s3_client().get_object(Bucket=bucket, Key=key)["Body"].read())
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise missing(url, what) from None
            raise s3_problem(url, e) from None
        except BotoCoreError as e:
            raise s3_problem(url, e) from None
    try:
        info = os.stat(url)
        if not stat.S_ISREG(info.st_mode):  # a pipe or device would block or never end
            raise damaged(url, "it is not a regular file")
        if info.st_size > MAX_INDEX_BYTES:
            raise damaged(url, f"it has {info.st_size:,} bytes (an index has at most {MAX_INDEX_BYTES:,})")
        return Path(url).read_bytes()
    except FileNotFoundError:
        raise missing(url, what) from None
    except OSError as e:
        raise damaged(url, f"it cannot be read ({e.strerror or e})") from None


def missing(url: str, what: str) -> UserError:
    return UserError(
        f"'{url}' does not exist: {what} of complete shards made by `optimize` is missing.",
        "point --data.root at shards made by `python -m project optimize`, or make them again into a new "
        "folder (an interrupted optimize leaves no shards.json).",
    )


def damaged(url: str, problem: str) -> UserError:
    """The one message for a shard file that is not what `optimize` writes."""
    return UserError(
        f"Shards file '{url}' is not what `optimize` writes: {problem}.",
        "make the shards again with `python -m project optimize` from the images, or ask whoever made them "
        "for a complete copy.",
    )


@dataclass(frozen=True)
class SplitRecord:
    """One split in shards.json: its samples, the samples per class, and the files left out as bad
    (`optimize --data.skip_bad_images`; the ids, positions among all the split's files, run to
    count + skipped)."""

    count: int
    class_counts: dict[str, int]
    skipped: int = 0


@dataclass(frozen=True)
class ShardsRecord:
    """shards.json, checked: what the template needs before it reads a chunk.

    Args:
        task: multiclass (one class per sample)
            or multilabel (a multi-hot row per sample).  # room: multilabel
        class_names: The classes, in label order.
        splits: train and val, and test when the data has one.
        source: The image folder the shards were made from (shown in messages only).
        max_side: `optimize --max_side`, or None.
    """

    task: str
    class_names: tuple[str, ...]
    splits: dict[str, SplitRecord]
    source: str
    max_side: int | None

    def to_json(self) -> str:
        record = {"format": FORMAT, **asdict(self), "class_names": list(self.class_names)}
        return json.dumps(record, indent=2) + "\n"


def _whole(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def parse_record(text: bytes, where: str) -> ShardsRecord:
    """shards.json's text as a ShardsRecord; one UserError naming the first key that is not as written."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise damaged(where, f"it is not JSON ({e})") from None

    def refuse(key: str, expected: str) -> NoReturn:
        value = data
        for part in key.split(".") if isinstance(data, dict) else ():
            value = value.get(part) if isinstance(value, dict) else None
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise damaged(where, f"'{key}' is {shown}; expected {expected}")

    if not isinstance(data, dict):
        refuse("(the whole file)", "a JSON object")
    if data.get("format") != FORMAT:
        refuse("format", f"{FORMAT} (shards of another version of the template)")
    task = data.get("task")
    if task not in TASKS:
        refuse("task", f"one of {', '.join(TASKS)}")
    names = data.get("class_names")
    if not (isinstance(names, list) and all(isinstance(n, str) and 0 < len(n) <= 255 for n in names)):
        refuse("class_names", "a list of class names, strings of 1 to 255 characters")
    if len(set(names)) != len(names):
        refuse("class_names", "distinct names")
    fewest = 2  # softmax over one class: nothing to learn
    # room: multilabel begin
    multilabel = is_multilabel(SimpleNamespace(task=task))
    fewest = 1 if multilabel else fewest  # a sigmoid per label: one label can be learnt
    # room: multilabel end
    if not fewest <= len(names) <= MAX_CLASSES:
        refuse("class_names", f"{fewest} to {MAX_CLASSES:,} classes")
    splits = data.get("splits")
    if not (isinstance(splits, dict) and {"train", "val"} <= set(splits) <= set(SPLITS)):
        refuse("splits", "an object with train and val (and optionally test)")
    present = [name for name in SPLITS if name in splits]
    records = {
        name: _split_record(
            splits[name],
            name,
            names,
            refuse,
            multilabel,  # room: multilabel
        )
        for name in present
    }
    source = data.get("source", "")
    if not isinstance(source, str):
        refuse("source", "the image folder's path, a string")
    max_side = data.get("max_side")
    if max_side is not None and not _whole(max_side, 1):
        refuse("max_side", "null or a positive whole number of pixels")
    return ShardsRecord(task, tuple(names), records, source, max_side)


def _split_record(
    value: Any,
    name: str,
    names: list[str],
    refuse: Any,
    multilabel: bool = False,  # room: multilabel
) -> SplitRecord:
    key = f"splits.{name}"
    if not isinstance(value, dict):
        refuse(key, "an object with count and class_counts")
    count, counts, skipped = value.get("count"), value.get("class_counts"), value.get("skipped", 0)
    if not _whole(count, 1):
        refuse(f"{key}.count", "a whole number of samples, at least 1 (an empty split trains nothing)")
    if not _whole(skipped):
        refuse(f"{key}.skipped", "a whole number of files left out, at least 0")
    if not (isinstance(counts, dict) and list(counts) == names and all(_whole(n) for n in counts.values())):
        refuse(f"{key}.class_counts", "a count (a whole number >= 0) for each class, in class_names' order")
    # room: multilabel begin
    if multilabel:  # samples that carry each label: none more than the split's
        if max(counts.values()) > count:
            refuse(f"{key}.class_counts", f"counts of at most the split's count {count}")
        return SplitRecord(count, dict(counts), skipped)
    # room: multilabel end
    total = sum(counts.values())
    if total != count:
        refuse(
            f"{key}.class_counts",
            f"counts adding up to the split's count {count} (they add up to {total})",
        )
    return SplitRecord(count, dict(counts), skipped)


def read_index(root: str | Path) -> ShardsRecord:
    """shards.json of `root`, checked (parse_record)."""
    where = join(root, INDEX)
    return parse_record(read_bytes(where, "the shard index (shards.json)"), where)


def written_count(url: str) -> int:
    """The samples LitData's index.json at split `url` says its chunks hold (0 when it has none)."""
    raw = read_bytes(join(url, "index.json"), "the split's LitData index (index.json)")
    return sum(int(chunk["chunk_size"]) for chunk in json.loads(raw).get("chunks") or [])


def write_index(root: str | Path, record: ShardsRecord) -> None:
    """Write shards.json last: its presence marks the shards complete."""
    text = record.to_json()
    if is_url(root):
        bucket, key = bucket_key(join(root, INDEX))
        s3_client().put_object(Bucket=bucket, Key=key, Body=text.encode())
    else:
        atomic_write(Path(root) / INDEX, text.encode())


def output_is_empty(root: str | Path) -> bool:
    """Whether nothing is at `root` yet (a folder that does not exist or is empty; an empty prefix)."""
    if not is_url(root):
        return not Path(root).exists() or not any(Path(root).iterdir())
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = bucket_key(str(root).rstrip("/") + "/")
    try:
        listing = s3_client().list_objects_v2(Bucket=bucket, Prefix=prefix.lstrip("/"), MaxKeys=1)
    except (BotoCoreError, ClientError) as e:
        raise s3_problem(str(root), e) from None
    return listing.get("KeyCount", 0) == 0


def allow_plain_http() -> None:
    """Let LitData's uploads reach an http:// endpoint (a MinIO or moto server on the local network).

    LitData uploads through obstore with fixed client options and no `allow_http`
    (litdata/streaming/downloader.py, `_OBSTORE_CLIENT_OPTIONS`), so obstore refuses a plain-HTTP
    endpoint that boto3 (reads, shards.json) accepts; the smallest way around is to add the option.
    """
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    if endpoint.startswith("http://"):
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[index]


def object_sizes(url: str) -> dict[str, int]:
    """Name -> size of every object under the prefix `url` of a bucket."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = bucket_key(url.rstrip("/") + "/")
    try:
        pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return {o["Key"].removeprefix(prefix): o["Size"] for page in pages for o in page.get("Contents", [])}
    except (BotoCoreError, ClientError) as e:
        raise s3_problem(url, e) from None


def check_uploaded(url: str) -> None:
    """Every chunk LitData's index names is in the bucket: LitData logs a failed upload and goes on
    (litdata/processing/data_processor.py, "Failed to upload"), so a run would otherwise end 'done'."""
    index = json.loads(read_bytes(join(url, "index.json"), "the split's LitData index (index.json)"))
    present = object_sizes(url)
    missing = [c["filename"] for c in index["chunks"] if c["filename"] not in present]
    if missing:
        raise UserError(
            f"The upload to '{url}' is incomplete: {len(missing)} chunk(s) missing, e.g. {missing[0]}.",
            "see the upload error above, then run optimize again into an empty prefix.",
        )
