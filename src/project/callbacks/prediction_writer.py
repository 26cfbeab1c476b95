"""Write `predict` results to a CSV: file, class_name, probability, the top-k classes (`prediction_csv`).

# room: multilabel begin
For a multi-label model: file, the predicted labels, and every label's probability.
# room: multilabel end
Under DDP the rows of every process are gathered: the CSV has each image exactly once, whatever the
strategy.

`predict_step` returns logits; probabilities are their softmax, exactly as `infer` and `serve` give them.
# room: calibration begin
They are calibrated with the temperature of the checkpoint's export through
`project.deploy.calibration`.
# room: calibration end
# room: unknown begin

class_name is `unknown` below the export's unknown threshold, and `reason` says why. The unknown score
is that of the image as the export sees it, its plain view (the network's first run on each batch,
its logits and features taken by hooks), so that predict and the export give every image the same
verdict.
# room: recipes begin
With test-time augmentation too: its views run after the plain one.
# room: recipes end
# room: unknown end
"""

from __future__ import annotations

import csv
import json  # room: calibration
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from project.atomic import atomic_files

# room: unknown begin
from project.backbones import feature_layer

# room: unknown end
# room: calibration begin
from project.checkpoint_io import load_checkpoint_file

# room: calibration end
from project.deploy import prediction_csv

# room: calibration begin
from project.deploy.calibration import Calibration

# room: calibration end
# room: unknown begin
from project.deploy.feature_bank import descriptors

# room: unknown end
from project.deploy.outputs import (
    Outputs,  # room: unknown
    softmax,
)

# room: calibration begin
from project.deploy.sidecar import Sidecar, source_of

# room: calibration end
# room: unknown begin
from project.deploy.unknown import UNKNOWN

# room: unknown end
# room: calibration begin
from project.errors import UserError

# room: calibration end
from project.model import (
    is_multilabel,  # room: multilabel
    label_names,
)
from project.terminal import printable


class PredictionWriter(BasePredictionWriter):
    """One CSV row per image, in file order, written by rank 0 when predict ends (atomically).

    Each process keeps the dataset positions of its images with their top-k probabilities, a few bytes
    per image; under DDP rank 0 gathers every process's share, and an
    image that a distributed sampler handed to two processes (its padding) is written once.
    """

    # `sidecar` is described twice below: help shows the second, the unknown room's  # room: unknown
    def __init__(
        self,
        output: str | None = None,
        top_k: int = 5,
        sidecar: str | None = "auto",  # room: calibration
        unknown_accept: float | None = None,  # room: unknown
    ) -> None:
        """
        Args:
            output: CSV file to write (replaced atomically when prediction finishes); null: a new
                `predictions-<time>.csv` in the run's `logs/<run>/predict/`, beside its other outputs.
            top_k: How many of the most likely classes to list per image.
            # room: calibration begin
            sidecar: The export sidecar (.json) whose calibration applies; `auto`: the newest export
                of --ckpt_path in its folder; null: plain softmax.
            # room: calibration end
            # room: unknown begin
            sidecar: The export sidecar (.json) whose temperature and unknown threshold apply;
                `auto`: the newest export of --ckpt_path in its folder; null: plain softmax.
            unknown_accept: Override the export's share of validation images accepted (0: never
                `unknown`); null: the export's.
            # room: unknown end
        """
        super().__init__(write_interval="batch")
        self.output = Path(output) if output is not None else None
        self._target = self.output  # where this predict writes (on_predict_start)
        self.top_k = top_k
        self.sidecar = sidecar  # room: calibration
        self.unknown_accept = unknown_accept  # room: unknown
        self.calibration = Calibration()  # room: calibration
        self._positions: list[torch.Tensor] = []
        self._probabilities: list[torch.Tensor] = []
        self._classes: list[torch.Tensor] = []
        # room: unknown begin
        self._known: list[torch.Tensor] = []
        self._scores: list[torch.Tensor] = []  # the unknown scores, for the `reason` column
        # room: unknown end
        self._first_view: FirstView | None = None  # room: unknown

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # on every rank: log_dir is a collective call under DDP
        self._target = self.output or new_csv(Path(trainer.log_dir or "."))
        self._positions, self._probabilities, self._classes = [], [], []
        self._known, self._scores = [], []  # room: unknown
        # room: recipes begin
        tta = getattr(pl_module, "tta", "none")
        if tta != "none" and trainer.is_global_zero:
            print(
                f"Predicting with test-time augmentation (--model.tta={tta}, the run's setting unless "
                "given): each image's probabilities are the mean of its views' logits, which the "
                "exports that `infer` and `serve` run do not compute, so their top classes can differ"
                + " (the `unknown` verdict is the plain image's, as theirs)"  # room: unknown
                + ". --model.tta=none predicts as they do."
            )
        # room: recipes end
        self.calibration = self._calibration(trainer, pl_module)  # room: calibration
        # room: unknown begin
        net = getattr(pl_module, "net", None)  # a classifier of this project: take its plain view's outputs
        self._first_view = None if net is None else FirstView(net, self.calibration.needs_features)
        # room: unknown end

    # room: unknown begin
    @override
    def on_predict_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._first_view is not None:
            self._first_view.reset()

    # room: unknown end

    # room: calibration begin
    def _calibration(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Calibration:
        """The calibration of the checkpoint's export (its sidecar), or the plain softmax without one."""
        # room: multilabel begin
        if is_multilabel(pl_module):  # a sigmoid per label: nothing to calibrate
            return Calibration()
        # room: multilabel end
        found = self._export_sidecar(trainer)
        if found is None:
            return Calibration()
        _check_classes(found, self.sidecar, label_names(pl_module))
        return found.calibration(
            self.unknown_accept,  # room: unknown
        )

    def _export_sidecar(self, trainer: L.Trainer) -> Sidecar | None:
        """The sidecar to calibrate with, or None (said on stdout) when there is none."""
        if self.sidecar is None:
            return None
        if self.sidecar != "auto":
            if not Path(self.sidecar).is_file():
                raise UserError(
                    f"--predictions.sidecar '{self.sidecar}' is not a file.",
                    "pass the .json that `python -m project export` wrote beside the .onnx, or `auto`.",
                )
            return Sidecar.load(Path(self.sidecar))  # every value checked, the key named
        found = export_of(trainer.ckpt_path)
        if not trainer.is_global_zero:
            return found
        if found is None:
            print(
                no_export_message(trainer.ckpt_path)
                if trainer.ckpt_path
                else "No --ckpt_path, so no export to calibrate with: probabilities are the plain softmax"
                + " and no image is `unknown`"  # room: unknown
                + "."
            )
        elif Path(found.source_checkpoint or "").resolve() != Path(trainer.ckpt_path).resolve():
            print(
                f"Calibrated with the export of '{found.source_checkpoint}': its weights are those of "
                f"'{trainer.ckpt_path}'."
            )
        return found

    # room: calibration end
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
        logits = prediction.detach().float().cpu()
        probabilities, classes = self._answers(logits, pl_module)
        self._positions.append(batch[1].detach().cpu())
        self._probabilities.append(probabilities.double())
        self._classes.append(classes)
        self._take_verdicts(logits, batch[0])  # room: unknown

    def _answers(
        self, logits: torch.Tensor, pl_module: L.LightningModule
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The probabilities of each image's top k classes, and those classes."""
        # room: multilabel begin
        if is_multilabel(pl_module):  # every label's probability, in label order; no classes
            return logits.sigmoid(), torch.empty(len(logits), 0, dtype=torch.long)
        # room: multilabel end
        every = softmax(
            logits.numpy(),
            self.calibration.temperature,  # room: calibration
        )
        probabilities, classes = torch.from_numpy(every).topk(self._k(pl_module), dim=1)
        return probabilities, classes

    def _widths(self, pl_module: L.LightningModule) -> tuple[int, int]:
        """How many probabilities and classes each image keeps: its top k."""
        # room: multilabel begin
        if is_multilabel(pl_module):  # every label's probability, no classes
            return len(label_names(pl_module)), 0
        # room: multilabel end
        return self._k(pl_module), self._k(pl_module)

    # room: unknown begin
    def _take_verdicts(self, logits: torch.Tensor, images: torch.Tensor) -> None:
        """Keep whether each image of the batch is `unknown`, and its unknown score, judged on the image as
        the export sees it: its plain view's logits (and features). A model without calibration answers
        every image with its classes."""
        plain = self._first_view.take(images) if self._first_view else Outputs(logits.numpy())
        unknown, scored = self.calibration.verdict(plain)
        self._known.append(torch.from_numpy(~unknown))
        self._scores.append(
            torch.zeros(len(logits), dtype=torch.double) if scored is None else torch.from_numpy(scored)
        )

    # room: unknown end

    @override
    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        width, classes_width = self._widths(pl_module)
        positions = _gather(trainer, pl_module, _cat(self._positions, (0,), torch.long))
        probabilities = _gather(trainer, pl_module, _cat(self._probabilities, (0, width), torch.double))
        classes = _gather(trainer, pl_module, _cat(self._classes, (0, classes_width)))
        columns = [positions, probabilities, classes]
        # room: unknown begin
        columns.append(_gather(trainer, pl_module, _cat(self._known, (0,), torch.bool)))
        columns.append(_gather(trainer, pl_module, _cat(self._scores, (0,), torch.double)))
        self._known, self._scores = [], []
        # room: unknown end
        self._positions, self._probabilities, self._classes = [], [], []
        if not trainer.is_global_zero:
            return
        # each image once, in the order of the file list: np.unique sorts and finds first occurrences
        order = np.unique(positions.numpy(), return_index=True)[1]
        rows = zip(*(column[order].tolist() for column in columns), strict=True)
        self._target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_files(self._target) as [partial], prediction_csv.open_csv(partial) as f:
            self._write(csv.writer(f), trainer, pl_module, rows)
        # said at teardown: here the progress bar is still on the screen, and the line landed inside it
        self._wrote = f"Wrote {len(order)} rows (one per image) to {printable(str(self._target))}"

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # room: unknown begin
        if self._first_view is not None:
            self._first_view.remove()
            self._first_view = None
        # room: unknown end
        if getattr(self, "_wrote", None):
            print(self._wrote)
            self._wrote = None

    def _write(self, writer: Any, trainer: L.Trainer, pl_module: L.LightningModule, rows: Any) -> None:
        dataset = trainer.predict_dataloaders.dataset
        names = label_names(pl_module)
        # room: multilabel begin
        if is_multilabel(pl_module):
            writer.writerow(prediction_csv.multilabel_header(names))
            for i, probs, *_ in rows:
                file = relative_name(dataset.files[i], dataset.root)
                writer.writerow(prediction_csv.multilabel_row(file, names, probs, pl_module.threshold))
            return
        # room: multilabel end
        writer.writerow(prediction_csv.header(self._k(pl_module)))
        for row in rows:
            i, top_p, top_c = row[:3]
            cells = [relative_name(dataset.files[i], dataset.root), [names[c] for c in top_c], top_p]
            cells += self._verdict(*row[3:])  # room: unknown
            writer.writerow(prediction_csv.row(*cells))

    # room: unknown begin
    def _verdict(self, known: bool, score: float) -> list[str]:
        """`prediction_csv.row`'s `class_name` and `reason` for an image answered `unknown`; none else."""
        return [] if known else [UNKNOWN, self.calibration.reason(score)]

    # room: unknown end

    def _k(self, pl_module: L.LightningModule) -> int:
        return min(self.top_k, len(label_names(pl_module)))


# room: calibration begin
def export_of(ckpt_path: str | os.PathLike | None) -> Sidecar | None:
    """The sidecar of the newest float export of `ckpt_path` in its folder, or None.

    An export of another checkpoint there whose model weights are `ckpt_path`'s counts too:
    right after a fit whose last epoch was its best, `last.ckpt` holds the weights the run
    exported from its best checkpoint (the two files differ only in their training state).
    """
    if not ckpt_path:
        return None
    ckpt = Path(ckpt_path).resolve()
    exports = float_exports(ckpt.parent)
    mine = [e for e in exports if e[2] == ckpt]
    if not mine:
        others = [e for e in exports if e[2] != ckpt and e[2].is_file()]
        weights = _weights(ckpt) if others else None
        mine = [e for e in others if weights is not None and _equal(_weights(e[2]), weights)][:1]
    if not mine:
        return None
    path, meta, _ = mine[0]
    return Sidecar.from_dict(meta, path)  # found by its checkpoint; every value checked here


def float_exports(folder: Path) -> list[tuple[Path, dict, Path]]:
    """(sidecar, its JSON object, its source checkpoint resolved) of each float export in `folder`,
    newest first; `latest.json` links are left out."""
    found: list[tuple[float, Path, dict, Path]] = []
    for path in folder.glob("*.json"):
        if path.is_symlink():
            continue
        # room: int8 begin
        if path.stem.endswith("-int8"):  # an int8 export: its sidecar names its float model's checkpoint
            continue
        # room: int8 end
        try:
            meta = json.loads(path.read_text())
        except (ValueError, OSError):
            continue  # not a sidecar
        source = source_of(meta)
        if source is not None:
            found.append((path.stat().st_mtime, path, meta, Path(source).resolve()))
    found.sort(key=lambda item: item[0], reverse=True)
    return [(path, meta, source) for _, path, meta, source in found]


def _weights(ckpt: Path) -> dict[str, torch.Tensor] | None:
    """The model weights a checkpoint file holds; None when it cannot be read as one."""
    try:
        weights = load_checkpoint_file(ckpt).get("state_dict")
    except UserError:  # unreadable or refused: not the same weights, and predict says why elsewhere
        return None
    return weights if isinstance(weights, dict) else None


def _equal(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor]) -> bool:
    return a is not None and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def no_export_message(ckpt_path: str | os.PathLike) -> str:
    """What predict says when `ckpt_path` has no export: which file to pass instead."""
    ckpt = Path(ckpt_path).resolve()
    plain = "probabilities are the plain softmax"
    plain += " and no image is `unknown`"  # room: unknown
    others = [e for e in float_exports(ckpt.parent) if e[2].is_file()]
    if not others:
        return (
            f"No export of '{ckpt_path}' beside it: {plain}. Export it first (python -m project export "
            f"--ckpt_path {ckpt_path}) or pass --predictions.sidecar=PATH.json."
        )
    sidecar, _, source = others[0]
    return (
        f"No export of '{ckpt_path}' beside it: {plain}. The run's export '{sidecar}' is of "
        f"'{source}', whose weights differ. Pass --ckpt_path={source} to predict with the exported "
        f"model and its calibration, or export this checkpoint first (python -m project export "
        f"--ckpt_path {ckpt_path})."
    )


def _check_classes(found: Sidecar, sidecar: str | None, names: list[str]) -> None:
    """A sidecar of another model would calibrate with the wrong temperature and threshold: refused."""
    if len(found.class_names) != len(names):
        raise UserError(
            f"The export sidecar {'of the checkpoint' if sidecar == 'auto' else repr(sidecar)} names "
            f"{len(found.class_names)} classes in 'class_names'; "
            f"the checkpoint's model has {len(names)}.",
            "pass --predictions.sidecar the .json exported from this checkpoint, or `auto`, or null.",
        )


# room: calibration end


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


def relative_name(path: Path, root: Path | None) -> str:
    """An image's name in the outputs: its path under the predicted folder."""
    return os.fsdecode(path.relative_to(root)) if root is not None else os.fsdecode(path)


def new_csv(folder: Path) -> Path:
    """`folder/predictions-<time>.csv`, never an earlier predict's file (a counter within one second)."""
    stem = time.strftime("predictions-%Y%m%d-%H%M%S")
    path, n = folder / f"{stem}.csv", 1
    while path.exists():
        path, n = folder / f"{stem}-{n}.csv", n + 1
    return path


# room: unknown begin
class FirstView:
    """The logits and penultimate features (numpy) of the network's first run on each batch: the plain
    image, which the export's unknown score is fitted on.
    # room: recipes begin
    Test-time augmentation runs its views after.
    # room: recipes end

    Args:
        net: The classifier's network.
        features: Take the features too (for a feature-space unknown score).
    """

    def __init__(self, net: torch.nn.Module, features: bool) -> None:
        self.logits: np.ndarray | None = None
        self.features: np.ndarray | None = None
        self.handles = [net.register_forward_hook(self._output)]
        layer = feature_layer(net) if features else None
        if layer is not None:
            self.handles.append(layer.register_forward_pre_hook(self._input))

    def _output(self, module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
        if self.logits is None:
            self.logits = output.detach().float().cpu().numpy()

    def _input(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        if self.features is None:
            self.features = inputs[0].detach().float().flatten(1).cpu().numpy()

    def reset(self) -> None:
        """Forget what ran before this batch: another callback's pass over the last batch (Grad-CAM's)
        would otherwise be taken for this batch's first view."""
        self.logits = self.features = None

    def take(self, images: torch.Tensor) -> Outputs:
        """This batch's logits, and its features beside the uint8 `images`' statistics
        (`feature_bank.descriptors`, as infer and serve describe an image)."""
        logits, features = self.logits, self.features
        self.reset()
        if features is None:
            return Outputs(logits)
        return Outputs(logits, descriptors(features, images.detach().cpu().numpy()))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def __enter__(self) -> FirstView:
        return self

    def __exit__(self, *exception: object) -> None:
        self.remove()


# room: unknown end
