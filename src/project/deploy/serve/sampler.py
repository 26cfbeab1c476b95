"""Keep a fraction of the images a service is asked about, with its answers, to look for data drift.

Each kept request becomes two files with one stem, `<UTC time>-<sequence>`: the image bytes as
received (`.jpg`, `.png`, ...) and a `.json` record (time, model version, image size, the answer).
Both are written atomically, image first, so a `.json` means a complete sample. The folder is
bounded: past `max_bytes` the oldest samples are deleted, so it always holds the latest traffic,
which is what a comparison with the training data needs. Only files named like samples are ever
deleted. Writing happens in a thread of its own behind a short queue, bounded in items and in
bytes (the images it holds are no longer counted by the service's body budget); when it is full
the sample is skipped (and counted), never waited for.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import re
import threading
import time
from collections import OrderedDict
from datetime import datetime, timezone
from pathlib import Path

from project.atomic import atomic_write, remove_partials

log = logging.getLogger("uvicorn.error")
SAMPLE_NAME = re.compile(r"^(?P<stem>\d{8}T\d{6}\.\d{6}Z-\d{6})\.\w+$")
EXTENSIONS = {
    "JPEG": ".jpg",
    "PNG": ".png",
    "BMP": ".bmp",
    "GIF": ".gif",
    "TIFF": ".tif",
    "WEBP": ".webp",
    "PPM": ".ppm",
}


class Sampler:
    """Store `fraction` of the offered requests in `folder`, at most `max_bytes` of them, oldest dropped."""

    def __init__(
        self,
        folder: Path,
        fraction: float,
        max_bytes: int,
        queue_size: int = 64,
        max_queued_bytes: int = 64 * 2**20,
    ) -> None:
        self.folder = folder
        self.fraction = fraction
        self.max_bytes = max_bytes
        folder.mkdir(parents=True, exist_ok=True)
        remove_partials(folder)  # what a killed writer left; nothing else writes here yet
        self._samples = self._existing()  # stem -> (files, bytes), oldest first
        self.bytes = sum(size for _, size in self._samples.values())
        self.written = self.deleted = self.failed = 0
        self.skipped_busy = 0  # counted on the event loop's thread
        self.skipped_too_large = 0  # counted on the writer's thread
        self._sequence = 0
        self._random = random.Random()
        self._queue: queue.Queue[tuple | None] = queue.Queue(queue_size)
        self.max_queued_bytes = max_queued_bytes
        self._queued_bytes = 0  # images offered and not yet written
        self._queued_lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="sampler", daemon=True)
        self._thread.start()

    def offer(self, image: bytes, image_format: str | None, record: dict) -> None:
        """Keep this request with probability `fraction`; returns at once whatever happens."""
        if self._random.random() >= self.fraction:
            return
        with self._queued_lock:
            if self._queued_bytes + len(image) > self.max_queued_bytes:
                self.skipped_busy += 1  # the disk is slower than the traffic: skip rather than hold
                return
            self._queued_bytes += len(image)
        try:
            self._queue.put_nowait((time.time(), image, image_format, record))
        except queue.Full:  # the disk is slower than the traffic: skip rather than slow requests
            self.skipped_busy += 1
            with self._queued_lock:
                self._queued_bytes -= len(image)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (for at most `timeout` seconds), then stop the thread."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def stats(self) -> dict:
        return {
            "folder": self.folder.name,  # never where it lives: /metrics is public
            "fraction": self.fraction,
            "max_bytes": self.max_bytes,
            "bytes": self.bytes,
            "samples": len(self._samples),
            "written": self.written,
            "skipped_busy": self.skipped_busy,
            "skipped_too_large": self.skipped_too_large,
            "deleted_oldest": self.deleted,
            "failed": self.failed,
        }

    def _existing(self) -> OrderedDict[str, tuple[list[Path], int]]:
        samples: dict[str, tuple[list[Path], int]] = {}
        for path in self.folder.iterdir():
            match = SAMPLE_NAME.match(path.name)
            if match and path.is_file():
                files, size = samples.get(match["stem"], ([], 0))
                samples[match["stem"]] = ([*files, path], size + path.stat().st_size)
        return OrderedDict(sorted(samples.items()))  # names sort by time

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._write(*item)
            except OSError as e:  # a full or read-only disk must not stop the service
                self.failed += 1
                if self.failed == 1:
                    log.warning(
                        "Sampler: cannot write to %s (%s); later failures are only counted", self.folder, e
                    )
            finally:
                with self._queued_lock:
                    self._queued_bytes -= len(item[1])

    def _write(self, when: float, image: bytes, image_format: str | None, record: dict) -> None:
        self._sequence = (self._sequence + 1) % 1_000_000
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(when)) + f".{int(when % 1 * 1e6):06d}Z"
        stem = f"{stamp}-{self._sequence:06d}"
        picture = self.folder / f"{stem}{EXTENSIONS.get(image_format or '', '.bin')}"
        utc = datetime.fromtimestamp(when, timezone.utc).isoformat()
        record = {"time": utc, "image": picture.name, "bytes": len(image), **record}
        text = (json.dumps(record, indent=1) + "\n").encode()
        size = len(image) + len(text)
        if size > self.max_bytes:  # could never fit: keeping it would delete everything else
            self.skipped_too_large += 1
            return
        atomic_write(picture, image)
        atomic_write(self.folder / f"{stem}.json", text)
        self._samples[stem] = ([picture, self.folder / f"{stem}.json"], size)
        self.bytes += size
        self._trim()
        self.written += 1  # counted once the folder is back within its bound, as /metrics then shows it

    def _trim(self) -> None:
        while self.bytes > self.max_bytes and self._samples:
            _, (files, size) = self._samples.popitem(last=False)
            for path in files:
                path.unlink(missing_ok=True)
            self.bytes -= size
            self.deleted += 1
