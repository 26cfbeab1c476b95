"""The list of files skipped as unreadable, kept in the run folder as `skipped_files.txt`.

Loader workers are separate processes: each appends to its own hidden part file (one `write` per
line, so lines never interleave); the main process merges the parts into the sorted, de-duplicated
list, written atomically, when a stage ends. Parts left by a killed run are merged by the next one.
"""

from __future__ import annotations

import os
from pathlib import Path

from project.atomic import atomic_write

REPORT = "skipped_files.txt"


class SkipLog:
    """Record `path<TAB>reason` lines (paths as raw bytes: names need not be UTF-8) under `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def add(self, path: Path, reason: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        line = (
            os.fsencode(path) + b"\t" + " ".join(reason.split()).encode("utf-8", "backslashreplace") + b"\n"
        )
        part = self.folder / f".skipped-{os.getpid()}.part"
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def merge(self) -> tuple[Path, int]:
        """Fold every part file into the report; returns the report's path and how many files the parts
        name (those skipped since the last merge, not an earlier command's)."""
        report = self.folder / REPORT
        parts = sorted(self.folder.glob(".skipped-*.part"))
        if not parts:
            return report, 0
        new = {line for part in parts for line in part.read_bytes().splitlines() if line}
        lines = set(report.read_bytes().splitlines()) if report.is_file() else set()
        atomic_write(report, b"".join(line + b"\n" for line in sorted(lines | new)))
        for part in parts:
            part.unlink(missing_ok=True)
        return report, len(new)
