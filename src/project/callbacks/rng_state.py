"""The global random number generators, in checkpoints: a resumed run draws what an unbroken run would."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class RNGState(Callback):
    """Save python, numpy and torch (CPU, CUDA) RNG states with every checkpoint; restore them on resume.

    The sampler's shuffle order and the loader workers' seeds are drawn from the global torch RNG
    each time an epoch's iterator is created, and augmentation draws from it too (with
    num_workers=0): without this a resumed run sees other batches than an uninterrupted one.
    Only plain values and tensors are stored, so checkpoints still load weights-only.
    """

    @override
    def state_dict(self) -> dict[str, Any]:
        version, keys, gauss = random.getstate()
        kind, mt, pos, has_gauss, cached = np.random.get_state()
        state = {
            "python": (version, keys, gauss),
            "numpy": (kind, torch.from_numpy(mt.astype(np.int64)), pos, has_gauss, cached),
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, keys, gauss = state["python"]
        random.setstate((version, tuple(keys), gauss))
        kind, mt, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, mt.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
