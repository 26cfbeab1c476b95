"""`optimize`'s worker: one image file to its shard sample, decoded as training decodes it.

A module of its own, importing neither torch's data module nor Lightning: LitData spawns each worker
and the worker imports the module that defines its `fn`, so a light module starts a worker in about a
second where `project.optimize` took about five.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image

from project.data.decode import BadImageError, decode_rgb, read_file
from project.data.skipped import SkipLog


class Sample:
    """The `fn` of litdata.optimize: one image file to its shard sample (a class: workers pickle it).

    Args:
        root: The folder the split's paths are relative to.
        max_side: Downscale images whose longer side exceeds it (re-encoded); None: bytes as they are.
        skip_log: Where a file that does not decode is listed (and left out); None: it stops the run.
    """

    def __init__(self, root: Path, max_side: int | None, skip_log: SkipLog | None) -> None:
        self.root = root
        self.max_side = max_side
        self.skip_log = skip_log

    def __call__(self, item: tuple[str, Any, int]) -> dict[str, Any] | None:
        path, label, sample_id = item
        try:
            data = read_file(self.root / path)
            # the decoding rule of training (Pillow's pixels, no torch in the workers): a bad file is found
            # now, not hours into a run
            decode_rgb(data, self.root / path)
            if self.max_side is not None:
                data = downscaled(data, self.max_side)
        except BadImageError as e:
            if self.skip_log is None:
                raise
            self.skip_log.add(Path(path), e.reason or str(e))
            return None  # litdata.optimize writes nothing for None
        return {"image": data, "label": label, "id": sample_id, "path": path}


def downscaled(data: bytes, max_side: int) -> bytes:
    """The image with its longer side at most `max_side`: JPEG (quality 95) stays JPEG, others PNG."""
    with Image.open(io.BytesIO(data)) as image:
        if max(image.size) <= max_side:
            return data
        fmt = "JPEG" if image.format == "JPEG" else "PNG"
        image.draft("RGB", (max_side, max_side))  # JPEG: decode at a reduced scale when it can
        small = image.convert("RGB")
        small.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
        out = io.BytesIO()
        small.save(out, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        return out.getvalue()
