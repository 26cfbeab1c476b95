"""Paths in a resumed checkpoint: trusted only when they name a checkpoint file of the run's own folder.

ModelCheckpoint keeps the files it wrote (`best_k_models`, `kth_best_model_path`, `last_model_path`,
`best_model_path`) in its state, and on resume it removes the ones a better or newer checkpoint
replaces. Lightning restores those paths as they are and only tests that the run's folder is among a
path's parents without resolving `..`: a checkpoint from elsewhere naming `checkpoints/<run>/../../x`
would have the run delete `x`, a folder recursively. Here every path is checked before ModelCheckpoint
sees it; one that does not stay inside the callback's folder (after `..` and symlinks), or that names
something other than a file there, is dropped with a warning. The checkpoint IO refuses such removals
too (project.checkpoint_io), for a ModelCheckpoint whose state never passed here.
"""

from __future__ import annotations

import math
import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

PATH_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


class CheckpointPaths(Callback):
    """Drop every path of a resumed ModelCheckpoint state that is not a file in that callback's folder."""

    @override
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Lightning calls every callback's on_load_checkpoint before any callback's load_state_dict
        states = checkpoint.get("callbacks")
        if not isinstance(states, dict):
            return
        for callback in trainer.checkpoint_callbacks:
            state = states.get(callback.state_key)
            if not isinstance(state, dict) or callback.dirpath is None:
                continue
            states[callback.state_key], dropped = trusted_state(state, str(callback.dirpath), callback.mode)
            if dropped:
                shown = ", ".join(repr(p) for p in dropped[:4]) + (" ..." if len(dropped) > 4 else "")
                rank_zero_warn(
                    f"The resumed checkpoint's ModelCheckpoint state names {len(dropped)} path(s) that "
                    f"are not checkpoint files in this run's folder '{callback.dirpath}': {shown}. "
                    "They are ignored: this run never removes (nor exports) them."
                )


def trusted_state(state: dict[str, Any], dirpath: str, mode: str) -> tuple[dict[str, Any], list[str]]:
    """`state` with only the paths that name a file in `dirpath`, kept consistent; and the paths dropped."""
    dropped: list[str] = []

    def own(path: Any) -> str:
        if path is None or (isinstance(path, str) and not path):
            return ""
        kept = own_file(path, dirpath)
        if kept is None and str(path) not in dropped:
            dropped.append(str(path))
        return kept or ""

    clean = {**state, **{key: own(state.get(key)) for key in PATH_KEYS}}
    best_k: dict[str, torch.Tensor] = {}
    given = state.get("best_k_models")
    for path, value in given.items() if isinstance(given, dict) else ():
        kept, score = own(path), _score(value)
        if kept and score is not None:
            best_k[kept] = score
    clean["best_k_models"] = best_k
    # as ModelCheckpoint itself derives them: the worst of the top k (the next to go), and the best
    if clean["kth_best_model_path"] not in best_k:
        worst = max if mode == "min" else min
        clean["kth_best_model_path"] = worst(best_k, key=lambda p: float(best_k[p])) if best_k else ""
    kth = clean["kth_best_model_path"]
    clean["kth_value"] = best_k[kth] if kth else torch.tensor(math.inf if mode == "min" else -math.inf)
    if not clean["best_model_path"] and best_k:
        best = min if mode == "min" else max
        clean["best_model_path"] = best(best_k, key=lambda p: float(best_k[p]))
    best_path = clean["best_model_path"]
    score = _score(state.get("best_model_score")) if best_path else None
    clean["best_model_score"] = best_k.get(best_path, score)
    return clean, dropped


def own_file(path: Any, dirpath: str) -> str | None:
    """`path` spelled as `dirpath/<name>` when it names a checkpoint file directly in `dirpath`; else None.

    Both the path's folder and where it leads (after `..` and symlinks) must be `dirpath`: a `last.ckpt`
    symlink to a file beside it is the link's own path, one leading out of the folder is refused. A path
    that exists but is not a file (a folder) is refused; a missing one is kept (nothing to remove, and
    other nodes of a multi-node run may not see the folder at all).
    """
    if not isinstance(path, str):
        return None
    if "://" in dirpath:  # a remote folder (fsspec): the name must follow it directly
        name = path.removeprefix(dirpath.rstrip("/") + "/")
        return path if name != path and name not in ("", ".", "..") and "/" not in name else None
    if "://" in path:
        return None
    folder, name = os.path.realpath(dirpath), os.path.basename(path)
    if name in ("", ".", "..") or os.path.realpath(os.path.dirname(path) or ".") != folder:
        return None
    if os.path.dirname(os.path.realpath(path)) != folder:
        return None
    if os.path.lexists(path) and not os.path.isfile(path):
        return None
    return os.path.join(dirpath, name)


def _score(value: Any) -> torch.Tensor | None:
    """A monitored value as ModelCheckpoint compares it (a scalar tensor); None if it is not a number."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        return value.detach().reshape(())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return torch.tensor(float(value))
    return None
