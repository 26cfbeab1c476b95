"""Write `predict` results to a CSV: file, class_name, probability, then the top-k classes.

For a multi-label model: file, the predicted labels, and every label's probability.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, TextIO

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from project import prediction_csv


class PredictionWriter(BasePredictionWriter):
    """Stream one CSV row per image to a temporary file; move it to `output` only when predict ends."""

    def __init__(self, output: str = "predictions.csv", top_k: int = 5) -> None:
        """
        Args:
            output: CSV file to write (replaced atomically when prediction finishes).
            top_k: How many of the most likely classes to list per image.
        """
        super().__init__(write_interval="batch")
        self.output = Path(output)
        self.top_k = top_k
        self._file: TextIO | None = None
        self._writer: Any = None

    @property
    def _partial(self) -> Path:
        return self.output.with_name(f".{self.output.name}.partial")

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self._file = prediction_csv.open_csv(self._partial)
        self._writer = csv.writer(self._file)
        if _multilabel(pl_module):
            self._writer.writerow(prediction_csv.multilabel_header(_names(pl_module)))
            return
        self._writer.writerow(
            prediction_csv.header(min(self.top_k, len(pl_module.class_names or [])) or self.top_k)
        )

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
        if self._writer is None or prediction is None:
            return
        dataset = trainer.predict_dataloaders.dataset
        names = _names(pl_module)
        if _multilabel(pl_module):
            for i, probs in zip(batch[1].tolist(), prediction.tolist(), strict=True):
                file = _relative(dataset.files[i], dataset.root)
                self._writer.writerow(prediction_csv.multilabel_row(file, names, probs, pl_module.threshold))
            return
        probs, classes = prediction.topk(min(self.top_k, prediction.shape[1]), dim=1)
        for i, top_p, top_c in zip(batch[1].tolist(), probs.tolist(), classes.tolist(), strict=True):
            file = _relative(dataset.files[i], dataset.root)
            self._writer.writerow(prediction_csv.row(file, [names[c] for c in top_c], top_p))

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = self._writer = None
        os.replace(self._partial, self.output)
        print(f"Predictions written to {self.output}")

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if self._file is not None:
            self._file.close()
            self._file = self._writer = None
            self._partial.unlink(missing_ok=True)


def _multilabel(pl_module: L.LightningModule) -> bool:
    return getattr(pl_module, "task", "multiclass") == "multilabel"


def _names(pl_module: L.LightningModule) -> list[str]:
    return list(pl_module.class_names or [str(i) for i in range(pl_module.hparams.num_classes)])


def _relative(path: Path, root: Path) -> str:
    return os.fsdecode(path.relative_to(root)) if root is not None else os.fsdecode(path)
