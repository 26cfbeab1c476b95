"""k-fold training: every image gets class probabilities from a model that never saw it.

Each fold trains a copy of the configured model (same initial weights) on the other folds, with the
data module's own transforms, then predicts every image once: the held-out rows give the
out-of-fold probabilities; all rows give that model's embedding space, used to
compare images for duplicates. Embeddings are the input of the classification layer
(project.backbones.head_of), taken by a forward hook: no change to the model.
"""

from __future__ import annotations

import copy
import logging
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from torch.utils.data import DataLoader, Dataset, Subset
from typing_extensions import override

from project.audit.stop import StopPoint
from project.backbones import head_of
from project.errors import UserError

# room: multilabel begin
from project.model import is_multilabel

# room: multilabel end

# The default recipe's length: about this many training images seen per fold, within [MIN, MAX] epochs
# (small data sets need more passes to learn anything; large ones fewer).
IMAGES_PER_FOLD = 8000
MIN_EPOCHS, MAX_EPOCHS = 3, 15


@dataclass
class FoldOutputs:
    """Out-of-fold probabilities [N, C]; per fold model, every image's embedding [N, D]."""

    probabilities: np.ndarray
    fold_of: np.ndarray  # the fold each image was held out in
    all_embeddings: list[np.ndarray]  # per fold model: [N, D] of every image


def make_folds(labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """The fold of each image: stratified by class, the same for the same seed."""
    splitter = fold_splitter(labels, folds, seed)
    fold_of = np.empty(len(labels), dtype=np.int64)
    for k, (_, held_out) in enumerate(splitter.split(np.zeros(len(labels)), labels)):
        fold_of[held_out] = k
    return fold_of


def fold_splitter(labels: np.ndarray, folds: int, seed: int) -> object:
    """scikit-learn's stratified k folds, shuffled by `seed`; refused when a class is too small for them."""
    from sklearn.model_selection import StratifiedKFold  # cleanlab's dependency: the audit extra

    # room: multilabel begin
    if labels.ndim == 2:  # multi-hot rows: no one class to stratify by, shuffled folds
        from sklearn.model_selection import KFold

        return KFold(folds, shuffle=True, random_state=seed)
    # room: multilabel end
    counts = np.bincount(labels)
    smallest = int(counts[counts > 0].min())
    if smallest < folds:
        raise UserError(
            f"--folds={folds}, but a class has only {smallest} readable images: every fold needs one "
            "image of every class.",
            f"use --folds={max(2, smallest)} or fewer, or add images to the small classes.",
        )
    return StratifiedKFold(folds, shuffle=True, random_state=seed)


def default_epochs(train_images: int) -> int:
    """Epochs of the short recipe for a fold of `train_images` training images."""
    return int(min(MAX_EPOCHS, max(MIN_EPOCHS, math.ceil(IMAGES_PER_FOLD / max(1, train_images)))))


class FoldProgressBar(TQDMProgressBar):
    """Lightning's bar, titled with the fold as well as the epoch."""

    def __init__(self, folds: int) -> None:
        super().__init__()
        self.folds = folds
        self.fold = 0

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, *args: object) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.train_progress_bar.set_description(
            f"Fold {self.fold + 1}/{self.folds}, epoch {trainer.current_epoch + 1}/{trainer.max_epochs}"
        )


@dataclass
class Recipe:
    """How each fold is trained and predicted: trainer settings, loaders, length."""

    trainer_kwargs: dict
    epochs: int
    batch_size: int
    num_workers: int
    seed: int
    progress: bool


def train_folds(
    model: L.LightningModule,
    train_data: Dataset,
    eval_data: Dataset,
    fold_of: np.ndarray,
    recipe: Recipe,
) -> FoldOutputs:
    """Train one model per fold; collect out-of-fold probabilities and each model's embeddings."""
    folds = int(fold_of.max()) + 1
    bar = FoldProgressBar(folds) if recipe.progress else None
    probabilities: np.ndarray | None = None
    every: list[np.ndarray] = []
    for k in range(folds):
        held_out = np.flatnonzero(fold_of == k)
        if bar is not None:
            bar.fold = k
        fold_model = copy.deepcopy(model)  # every fold starts from the same initial weights
        L.seed_everything(recipe.seed + k, verbose=False)
        train_rows = np.flatnonzero(fold_of != k)
        with quiet_lightning():  # Trainer() prints its banners: made inside
            trainer = fold_trainer(recipe, bar)
            loader = fold_loader(train_data, train_rows, recipe, training=True)
            trainer.fit(fold_model, train_dataloaders=loader)
            every_row = fold_loader(eval_data, np.arange(len(fold_of)), recipe)
            probs, feats = predict(fold_model, trainer, every_row)
        if probabilities is None:
            probabilities = np.zeros((len(fold_of), probs.shape[1]), dtype=np.float32)
        probabilities[held_out] = probs[held_out]
        every.append(feats)
    assert probabilities is not None
    return FoldOutputs(probabilities, fold_of, every)


@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Without the per-fold banners (GPU available, tips) and the warning that no validation loop runs."""
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")
            warnings.filterwarnings("ignore", message=".*LeafSpec.*")
            yield
    finally:
        logger.setLevel(level)


def fold_trainer(
    recipe: Recipe, bar: FoldProgressBar | None, *callbacks: Callback, **overrides: object
) -> L.Trainer:
    """A fold's trainer: the recipe's epochs; no logger, checkpoint or validation (`overrides`: others)."""
    kwargs = {
        **recipe.trainer_kwargs,
        "max_epochs": recipe.epochs,
        "max_steps": -1,
        "devices": 1,  # folds are short: one device, no process group to start per fold
        "num_nodes": 1,
        "logger": False,
        "enable_checkpointing": False,  # the fold models are thrown away after predicting
        "enable_progress_bar": bar is not None,
        "enable_model_summary": False,
        "callbacks": [StopPoint(), *callbacks, *([bar] if bar is not None else [])],
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        **overrides,
    }
    return L.Trainer(**kwargs)


def fold_loader(data: Dataset, rows: np.ndarray, recipe: Recipe, training: bool = False) -> DataLoader:
    """The `rows` of `data` in the recipe's batches (shuffled, without a last partial batch, for training)."""
    return DataLoader(
        Subset(data, rows.tolist()),
        batch_size=recipe.batch_size,
        shuffle=training,
        drop_last=training and len(rows) > recipe.batch_size,  # no 1-image batch for BatchNorm
        num_workers=recipe.num_workers,
        persistent_workers=False,
    )


def predict(
    model: L.LightningModule, trainer: L.Trainer, loader: DataLoader
) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, embeddings) of every image of `loader`, in order, via `predict_step` and a hook."""
    captured: list[torch.Tensor] = []

    def keep_input(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        captured.append(inputs[0].detach().float().flatten(1).cpu())

    handle = head_of(model.net).register_forward_hook(keep_input)
    try:
        batches = trainer.predict(model, dataloaders=loader)
    finally:
        handle.remove()
    logits = torch.cat([b.float().cpu() for b in batches])  # predict_step returns logits
    features = torch.cat(captured).numpy()
    # room: multilabel begin
    if is_multilabel(model):  # a sigmoid per label
        return logits.sigmoid().numpy(), features
    # room: multilabel end
    return logits.softmax(1).numpy(), features
