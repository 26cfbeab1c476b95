"""2-process DDP on CPU from shards: each training sample of an epoch reaches exactly one rank (issue 33)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from typing_extensions import override

from project.optimize import main as optimize
from tests.helpers import exit_status
from tests.shard_files import Recorder, WithIds

pytest.importorskip("litdata")


class RanksRecorder(Recorder):
    """Recorder that also counts validation images, and writes what its rank saw to `folder`."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.validated = 0

    @override
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> None:
        self.validated += len(batch[1])

    @override
    def on_fit_end(self) -> None:
        seen = {"train": self.seen, "val": self.validated}
        (self.folder / f"rank{self.global_rank}.json").write_text(json.dumps(seen))


@pytest.mark.slow
def test_two_ranks_share_an_epoch_without_overlap(shapes_root: Path, tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    assert exit_status(optimize, f"--data.root={shapes_root}", f"--output={shards}", "--workers=1") == 0
    data = WithIds(root=str(shards), image_size=32, batch_size=8, num_workers=0)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(RanksRecorder(tmp_path), data)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    train = [rank["train"] for rank in ranks]
    assert len(train[0]) == len(train[1]) == 24  # the same number of steps on each rank
    assert sorted(train[0] + train[1]) == list(range(48))  # every training image once, on one rank
    assert ranks[0]["val"] + ranks[1]["val"] == 24  # validation: every image once across the ranks
