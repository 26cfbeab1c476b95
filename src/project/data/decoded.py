"""Images decoded once into one flat uint8 buffer, read in place by the data sets (and by the audit's folds).

The buffer is one flat tensor plus two int64/int32 arrays (offsets, shapes): no per-image Python
objects, so forked loader workers share its pages and never copy them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodedImages:
    """Image i is `buffer[offsets[i]:][: prod(shapes[i])]` viewed as [C, H, W]; shape (0, 0, 0): bad file."""

    buffer: torch.Tensor  # uint8, flat
    offsets: torch.Tensor  # int64 [N]
    shapes: torch.Tensor  # int32 [N, 3]

    def __len__(self) -> int:
        return len(self.offsets)

    def image(self, i: int) -> torch.Tensor | None:
        c, h, w = self.shapes[i].tolist()
        if c == 0:
            return None
        start = int(self.offsets[i])
        return self.buffer[start : start + c * h * w].view(c, h, w)  # a view: no copy

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes + self.offsets.nbytes + self.shapes.nbytes
