"""Write `predict` results to a CSV: file, class_name, probability, then the top-k classes.

For a multi-label model: file, the predicted labels, and every label's probability. Under DDP the
rows of every process are gathered: the CSV has each image exactly once, whatever the strategy.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from project import prediction_csv
from project.atomic import atomic_files
from project.model import is_multilabel, label_names


class PredictionWriter(BasePredictionWriter):
    """One CSV row per image, in file order, written by rank 0 when predict ends (atomically).

    Each process keeps the dataset positions of its images with their top-k (multi-label: all)
    probabilities, a few bytes per image; under DDP rank 0 gathers every process's share, and an
    image that a distributed sampler handed to two processes (its padding) is written once.
    """

    def __init__(self, output: str = "predictions.csv", top_k: int = 5) -> None:
        """
        Args:
            output: CSV file to write (replaced atomically when prediction finishes).
            top_k: How many of the most likely classes to list per image.
        """
        super().__init__(write_interval="batch")
        self.output = Path(output)
        self.top_k = top_k
        self._positions: list[torch.Tensor] = []
        self._probabilities: list[torch.Tensor] = []
        self._classes: list[torch.Tensor] = []

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._positions, self._probabilities, self._classes = [], [], []

    @override
    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: torch.Tensor | None,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        if prediction is None:  # every image of the batch was skipped as bad
            return
        if is_multilabel(pl_module):  # every label's probability, in label order
            probabilities, classes = prediction, torch.empty(len(prediction), 0, dtype=torch.long)
        else:
            probabilities, classes = prediction.topk(self._k(pl_module), dim=1)
        self._positions.append(batch[1].detach().cpu())
        self._probabilities.append(probabilities.detach().float().cpu())
        self._classes.append(classes.detach().cpu())

    @override
    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        multilabel = is_multilabel(pl_module)
        width = len(label_names(pl_module)) if multilabel else self._k(pl_module)
        positions = _gather(trainer, pl_module, _cat(self._positions, (0,), torch.long))
        probabilities = _gather(trainer, pl_module, _cat(self._probabilities, (0, width), torch.float))
        classes = _gather(trainer, pl_module, _cat(self._classes, (0, 0 if multilabel else width)))
        self._positions, self._probabilities, self._classes = [], [], []
        if not trainer.is_global_zero:
            return
        # each image once, in the order of the file list: np.unique sorts and finds first occurrences
        order = np.unique(positions.numpy(), return_index=True)[1]
        rows = zip(
            positions[order].tolist(), probabilities[order].tolist(), classes[order].tolist(), strict=True
        )
        self.output.parent.mkdir(parents=True, exist_ok=True)
        with atomic_files(self.output) as [partial], prediction_csv.open_csv(partial) as f:
            self._write(csv.writer(f), trainer, pl_module, rows)
        print(f"Predictions written to {self.output}")

    def _write(self, writer: Any, trainer: L.Trainer, pl_module: L.LightningModule, rows: Any) -> None:
        dataset = trainer.predict_dataloaders.dataset
        names = label_names(pl_module)
        if is_multilabel(pl_module):
            writer.writerow(prediction_csv.multilabel_header(names))
            for i, probs, _ in rows:
                file = _relative(dataset.files[i], dataset.root)
                writer.writerow(prediction_csv.multilabel_row(file, names, probs, pl_module.threshold))
            return
        writer.writerow(prediction_csv.header(self._k(pl_module)))
        for i, top_p, top_c in rows:
            file = _relative(dataset.files[i], dataset.root)
            writer.writerow(prediction_csv.row(file, [names[c] for c in top_c], top_p))

    def _k(self, pl_module: L.LightningModule) -> int:
        return min(self.top_k, len(label_names(pl_module)))


def _cat(parts: list[torch.Tensor], empty: tuple[int, ...], dtype: torch.dtype = torch.long) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.empty(empty, dtype=dtype)


def _gather(trainer: L.Trainer, pl_module: L.LightningModule, local: torch.Tensor) -> torch.Tensor:
    """Every process's rows, concatenated by rank, on the CPU (processes may hold different counts)."""
    if trainer.world_size == 1:
        return local
    counts = pl_module.all_gather(torch.tensor(len(local), device=pl_module.device)).flatten().tolist()
    if max(counts) == 0:  # nothing predicted anywhere (every file bad)
        return local
    padded = torch.zeros((max(counts), *local.shape[1:]), dtype=local.dtype, device=pl_module.device)
    padded[: len(local)] = local  # all_gather needs the same shape everywhere
    gathered = pl_module.all_gather(padded).cpu()
    return torch.cat([part[:n] for part, n in zip(gathered, counts, strict=True)])


def _relative(path: Path, root: Path) -> str:
    return os.fsdecode(path.relative_to(root)) if root is not None else os.fsdecode(path)
