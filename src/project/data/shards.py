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
from pathlib import Path
from typing import Any

from project.atomic import atomic_write
from project.errors import UserError

INDEX = "shards.json"
FORMAT = 1
SPLITS = ("train", "val", "test")
# A bucket that cannot be reached is an error within seconds, not boto3's minutes of retries
CONNECT_TIMEOUT_S = 3
ATTEMPTS = 2


def litdata() -> Any:
    """The litdata module, an optional install (the `shards` extra)."""
    try:
        import litdata
    except ModuleNotFoundError:
        raise UserError(
            "Shards need LitData, which is not installed.", "pip install '.[shards]' (litdata and boto3)."
        ) from None
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


def has_index(root: str | Path) -> bool:
    """Whether `root` is a shards folder or URL (it has shards.json); a folder of images is not."""
    if is_url(root):
        return True  # only shards are read from a bucket; read_index says what is wrong with one
    return (Path(root) / INDEX).is_file()


def read_index(root: str | Path) -> dict[str, Any]:
    """shards.json of `root`, checked: the task, class names and per-split counts."""
    where = join(root, INDEX)
    if is_url(root):
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = bucket_key(where)
        try:
            text = s3_client().get_object(Bucket=bucket, Key=key)["Body"].read().decode()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise UserError(
                    f"'{where}' does not exist: '{root}' holds no shards made by `optimize`.",
                    f"run `python -m project optimize --data.root=IMAGES --output {root}` first.",
                ) from None
            raise s3_problem(where, e) from None
        except BotoCoreError as e:
            raise s3_problem(where, e) from None
    else:
        text = Path(where).read_text()
    try:
        index = json.loads(text)
        ok = index.get("format") == FORMAT and {"train", "val"} <= set(index["splits"])
    except (ValueError, AttributeError, KeyError, TypeError):
        ok = False
    if not ok:
        raise UserError(
            f"'{where}' is not a shard index of format {FORMAT} with train and val splits.",
            "make the shards again with this version's `python -m project optimize`.",
        )
    return index


def write_index(root: str | Path, index: dict[str, Any]) -> None:
    """Write shards.json last: its presence marks the shards complete."""
    text = json.dumps(index, indent=2) + "\n"
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


def check_uploaded(url: str) -> None:
    """Every chunk LitData's index names is in the bucket: LitData logs a failed upload and goes on
    (litdata/processing/data_processor.py, "Failed to upload"), so a run would otherwise end 'done'."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = bucket_key(url.rstrip("/") + "/")
    client = s3_client()
    try:
        index = json.loads(client.get_object(Bucket=bucket, Key=prefix + "index.json")["Body"].read())
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        present = {o["Key"].removeprefix(prefix) for page in pages for o in page.get("Contents", [])}
    except (BotoCoreError, ClientError) as e:
        raise s3_problem(join(url, "index.json"), e) from None
    missing = [c["filename"] for c in index["chunks"] if c["filename"] not in present]
    if missing:
        raise UserError(
            f"The upload to '{url}' is incomplete: {len(missing)} chunk(s) missing, e.g. {missing[0]}.",
            "see the upload error above, then run optimize again into an empty prefix.",
        )
