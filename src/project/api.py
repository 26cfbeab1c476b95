"""The template from Python: train, look at the data, predict with a checkpoint or an export.

    from project import api

    run = api.fit("--trainer.max_epochs=2")          # `python -m project fit ...`: the same configs and flags
    api.show_batch()                                  # augmented training images beside validation's view
    api.report(run)                                   # its curves and confusion matrix, as a picture
    model = api.load(run.best_checkpoint)            # PyTorch: the run's preprocessing (and calibration)
    model.predict("photo.jpg")                        # a file, its bytes, a PIL image or a uint8 numpy array
    deployed = api.load(run.export)                   # torch-free (.onnx or OpenVINO .xml): `infer`'s answers

Everything the command line does runs through the command line's own code (project.cli), so a
config file, a flag and a mistake mean the same here; a mistake raises `project.errors.UserError`
(its message says the fix) instead of ending the process. Importing this module imports neither
torch nor lightning: loading an export stays torch-free, as `infer` does. docs/python.md.
"""

from __future__ import annotations

import json
import os
import tempfile  # room: pictures
from collections.abc import Mapping, Sequence
from dataclasses import (
    dataclass,
    field,
    replace,  # room: unknown
)
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from project.data.decode import pil_rgb

# room: calibration begin
from project.deploy.calibration import Calibration

# room: calibration end
from project.deploy.classifier import RUNTIMES, Classifier
from project.deploy.outputs import Outputs, softmax

# room: unknown begin
from project.deploy.unknown import UNKNOWN

# room: unknown end

# What `predict` takes: a file (path), a file's bytes, a PIL image, or a uint8 RGB array [H, W, 3]
# (or grayscale [H, W]), values 0-255
ImageInput = str | os.PathLike | bytes | Image.Image | np.ndarray
KINDS = "a file path, the file's bytes, a PIL image, or a uint8 numpy array [H, W, 3] (values 0-255)"


@dataclass(frozen=True)
class Prediction:
    """One image's answer, as `predict`, `infer` and `serve` give it.

    `names` and `probabilities`: the top-k classes, most probable first, with their probabilities
    (calibrated where the export has a temperature). `class_name` is the top class. `labels`: the
    predicted labels (the class).
    # room: multilabel begin

    Multi-label: `names` and `probabilities` are every label, most probable first, a sigmoid each, and
    `labels` those at or above the threshold.
    # room: multilabel end
    # room: unknown begin

    `class_name` is `unknown` when the export's unknown threshold refuses the image (`reason` says why),
    and `labels` is then empty.
    # room: unknown end
    """

    class_name: str
    names: list[str]
    probabilities: list[float]
    labels: list[str] = field(default_factory=list)
    # room: unknown begin
    unknown: bool = False
    score: float | None = None  # the unknown score, when the export has a threshold
    reason: str = ""
    # room: unknown end

    @property
    def probability(self) -> float:
        """The top class's probability."""
        return self.probabilities[0]


@dataclass(frozen=True)
class Run:
    """Where a fit went: its name, folders, best checkpoint and export, and its last logged metrics."""

    name: str
    logs: Path | None
    checkpoints: Path | None
    best_checkpoint: Path | None
    last_checkpoint: Path | None
    export: Path | None
    metrics: dict[str, float]


# ---- training ---------------------------------------------------------------------------------------


def fit(*flags: str, overrides: Mapping[str, Any] | None = None) -> Run:
    """`python -m project fit FLAGS...` in this process; returns where the run went.

    `flags` are the command line's own (`"--config", "configs/presets/debug.yaml"`, `"--data.root=x"`);
    `overrides` the same as a mapping (`{"trainer.max_epochs": 2}`), given after them.
    """
    cli = _cli("fit", flags, overrides)
    trainer = cli.trainer
    checkpoint = trainer.checkpoint_callback
    folder = Path(checkpoint.dirpath) if getattr(checkpoint, "dirpath", None) else None
    best = getattr(checkpoint, "best_model_path", "") or None
    last = folder / "last.ckpt" if folder is not None else None
    exported = next((c.exported for c in trainer.callbacks if getattr(c, "exported", None)), None)
    logs = getattr(trainer.logger, "log_dir", None) if trainer.logger is not None else None
    return Run(  # absolute: a notebook may change its working folder later
        name=str(cli.config.fit.name),
        logs=Path(logs).absolute() if logs else None,
        checkpoints=folder.absolute() if folder is not None else None,
        best_checkpoint=Path(best).absolute() if best else None,
        last_checkpoint=last.absolute() if last is not None and last.is_file() else None,
        export=Path(exported).absolute() if exported else None,
        metrics={k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1},
    )


# room: pictures begin
def show_batch(
    *flags: str, overrides: Mapping[str, Any] | None = None, output: str | os.PathLike | None = None
) -> Image.Image:
    """`python -m project show_batch FLAGS...`: augmented training images with their labels beside the
    validation view, as a PIL image (shown inline by Jupyter), without training.

    `output`: also keep the PNG there (otherwise it is written to a temporary file and read back).
    """
    with tempfile.TemporaryDirectory(prefix="show_batch-") as folder:
        target = Path(output) if output is not None else Path(folder) / "batch.png"
        _cli("show_batch", (*flags, f"--output={target}"), overrides)
        with Image.open(target) as img:
            return img.copy()


# room: pictures end
# room: report begin
def report(run: Run | str | os.PathLike) -> Image.Image:
    """`python -m project report RUN`: the run's curves, confusion matrix and per-class accuracy, as a PIL
    image (shown inline by Jupyter); report.png and report.html are written into the run's log folder."""
    from project.report import report as write_report

    where = run.logs if isinstance(run, Run) else run
    if where is None:
        raise ValueError("This run logged nothing (trainer.logger was off): there is no report to draw.")
    with Image.open(write_report(str(where))) as img:
        return img.copy()


# room: report end
def _cli(subcommand: str, flags: Sequence[str], overrides: Mapping[str, Any] | None) -> Any:
    """Run a LightningCLI subcommand of project.cli with these flags; returns the ProjectCLI."""
    if isinstance(flags, str):  # a guard for callers that pass one string to a list argument
        flags = [flags]
    for flag in flags:
        if not isinstance(flag, str):
            raise TypeError(
                f"The flags of {subcommand} are strings, as on the command line; got {flag!r}. "
                'Pass e.g. "--trainer.max_epochs=2", or overrides={"trainer.max_epochs": 2}.'
            )
    extra = [f"--{key}={_flag_value(value)}" for key, value in (overrides or {}).items()]
    from project.cli import ProjectCLI
    from project.runs import release_runs

    try:
        return ProjectCLI(args=[subcommand, *flags, *extra])
    finally:
        release_runs()  # as the command line does: the run's lock goes, finished or refused


def _flag_value(value: Any) -> str:
    """A Python value as the command line writes it (true, null, [1, 2]); strings as they are."""
    return value if isinstance(value, str) else json.dumps(value)


# ---- prediction -------------------------------------------------------------------------------------


def load(
    path: str | os.PathLike,
    unknown_accept: float | None = None,  # room: unknown
    threads: int | None = None,
) -> ExportModel | CheckpointModel:
    """A model to `predict` with: an export (.onnx, or another runtime's file such as OpenVINO's .xml)
    torch-free, or a checkpoint (.ckpt).

    `unknown_accept`: the share of validation images accepted (0: never `unknown`).  # room: unknown
    """
    path = Path(path)
    exports = (".onnx", *RUNTIMES)
    if path.suffix in exports:
        return ExportModel(
            path,
            unknown_accept,  # room: unknown
            threads,
        )
    if path.suffix == ".ckpt":
        return CheckpointModel(
            path,
            unknown_accept=unknown_accept,  # room: unknown
        )
    raise ValueError(
        f"'{path}' is neither an export ({', '.join(exports)}) nor a checkpoint (.ckpt). Pass "
        "checkpoints/<run>/latest.onnx (torch-free) or a .ckpt of checkpoints/<run>/."
    )


class _Predicting:
    """`predict` and `predict_many` over `_logits`, shared by exports and checkpoints."""

    class_names: list[str]

    def predict(self, image: ImageInput, top_k: int = 5) -> Prediction:
        """One image's Prediction: a file path, its bytes, a PIL image or a uint8 numpy array."""
        if isinstance(image, list | tuple):
            raise TypeError(
                f"predict takes one image; got a {type(image).__name__} of {len(image)}. "
                "Pass one image, or call predict_many(images) for a list."
            )
        return self.predict_many([image], top_k)[0]

    def predict_many(
        self, images: Sequence[ImageInput], top_k: int = 5, batch_size: int = 32
    ) -> list[Prediction]:
        """A Prediction per image of a list, in order."""
        if isinstance(images, str | bytes | os.PathLike | Image.Image | np.ndarray):
            raise TypeError(
                f"predict_many takes a list of images; got one {type(images).__name__}"
                f"{f' {str(images)!r}' if isinstance(images, str | os.PathLike) else ''}. "
                "Pass [image], or call predict(image)."
            )
        if top_k < 1:
            raise ValueError(f"top_k={top_k}: pass 1 or more (the number of classes to list).")
        checked = [as_input(image) for image in images]  # every input refused before any is run
        answers: list[Prediction] = []
        for start in range(0, len(checked), batch_size):
            answers += self._answers(self._logits(checked[start : start + batch_size]), top_k)
        return answers

    def _logits(self, images: list[Path | bytes | np.ndarray]) -> Any:
        """What `_answers` reads: the model's outputs for a batch of images."""
        raise NotImplementedError

    def _answers(self, outputs: Any, top_k: int) -> list[Prediction]:
        raise NotImplementedError


class ExportModel(_Predicting):
    """An export and its sidecar, torch-free: the answers of `infer` (project.deploy.classifier)."""

    def __init__(
        self,
        path: str | os.PathLike,
        unknown_accept: float | None = None,  # room: unknown
        threads: int | None = None,
    ) -> None:
        self.classifier = Classifier(
            path,
            threads,
            unknown_accept,  # room: unknown
        )
        self.class_names = list(self.classifier.class_names)

    def _logits(self, images: list[Path | bytes | np.ndarray]) -> Outputs:
        prepare = self.classifier.preprocess
        arrays = [prepare(Image.fromarray(x) if isinstance(x, np.ndarray) else x) for x in images]
        # with the features, where the unknown score needs them  # room: unknown
        return self.classifier.run(np.stack(arrays))

    def _answers(self, outputs: Outputs, top_k: int) -> list[Prediction]:
        classifier = self.classifier
        # room: multilabel begin
        if classifier.multilabel:
            return self._label_answers(outputs.logits)
        # room: multilabel end
        answers = []
        for probabilities in classifier.probabilities_of(outputs.logits):
            names, probs = classifier.top(probabilities, top_k)
            answers.append(Prediction(names[0], names, probs, [names[0]]))
        # room: unknown begin
        unknown, scores = classifier.unknown(outputs)
        if scores is not None:  # the export has a threshold: each answer's verdict, its score and why
            for i, answer in enumerate(answers):
                answers[i] = judged(answer, bool(unknown[i]), float(scores[i]), classifier.calibration)
        # room: unknown end
        return answers

    # room: multilabel begin
    def _label_answers(self, logits: np.ndarray) -> list[Prediction]:
        """A multi-label model's answers: every label, most probable first, and those at or above the
        threshold."""
        classifier, answers = self.classifier, []
        for probabilities in classifier.probabilities_of(logits):
            names, probs = classifier.top(probabilities, len(self.class_names))
            pairs = zip(self.class_names, probabilities, strict=True)
            chosen = [n for n, p in pairs if p >= classifier.threshold]
            answers.append(Prediction(names[0], names, probs, chosen))
        return answers

    # room: multilabel end


class CheckpointModel(_Predicting):
    """A checkpoint's model in PyTorch (`.model`, an ImageClassifier in eval mode on the CPU), with the
    run's own preprocessing (image size, crop, resize filter), as `predict`.

    # room: calibration begin
    And its export's calibration. `sidecar`: the export sidecar whose calibration applies; `auto`: the
    checkpoint's export beside it (as `predict --predictions.sidecar=auto`); None: the plain softmax.
    # room: calibration end
    """

    def __init__(
        self,
        path: str | os.PathLike,
        sidecar: str | os.PathLike | None = "auto",  # room: calibration
        unknown_accept: float | None = None,  # room: unknown
    ) -> None:
        # room: calibration begin
        from project.callbacks.prediction_writer import export_of

        # room: calibration end
        from project.checkpoint_io import load_checkpoint_file
        from project.checkpoint_values import checkpoint_layer
        from project.data.transforms import eval_transform

        # room: calibration begin
        from project.deploy.sidecar import Sidecar

        # room: calibration end
        from project.export import load_for_export

        self.path = Path(path)
        self.model = load_for_export(load_checkpoint_file(self.path))  # weights-only, eval, CPU
        data = checkpoint_layer(self.path, "predict")["data"]  # every value checked
        self.class_names = list(self.model.label_names)
        self.transform = eval_transform(
            self.model.image_size, data.get("crop_ratio", 0.875), data["interpolation"]
        )
        # room: calibration begin
        found = (
            export_of(self.path) if sidecar == "auto" else Sidecar.load(Path(sidecar)) if sidecar else None
        )
        self.sidecar = found
        self.calibration = (
            Calibration()
            if found is None
            else found.calibration(
                unknown_accept,  # room: unknown
            )
        )
        # room: calibration end

    def _logits(self, images: list[Path | bytes | np.ndarray]) -> Stepped:
        import torch

        # room: unknown begin
        from project.callbacks.prediction_writer import FirstView

        # room: unknown end
        from project.data.decode import decode_chw, load_rgb

        tensors = []
        for image in images:
            if isinstance(image, Path):
                tensors.append(load_rgb(image))  # libjpeg-turbo, as predict decodes
            elif isinstance(image, bytes):
                tensors.append(decode_chw(image, "the image"))
            else:
                tensors.append(torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))))
        batch = torch.stack([self.transform(t) for t in tensors])
        with (
            torch.no_grad(),
            # the plain image's outputs, as `predict` takes them for the unknown verdict  # room: unknown
            FirstView(self.model.net, self.calibration.needs_features) as view,  # room: unknown
        ):
            logits = self.model.predict_step((batch, None), 0).numpy()  # predict's own step
            plain = view.take(batch)  # room: unknown
        return Stepped(
            logits,
            plain,  # room: unknown
        )

    def _answers(self, outputs: Stepped, top_k: int) -> list[Prediction]:
        logits, names = outputs.logits, self.class_names
        # room: multilabel begin
        if self.model.multilabel:
            probabilities = 1 / (1 + np.exp(-logits))
            answers = []
            for p in probabilities:
                order = np.argsort(-p, kind="stable")
                chosen = [n for n, q in zip(names, p, strict=True) if q >= self.model.threshold]
                top = [names[i] for i in order]
                answers.append(Prediction(top[0], top, [float(p[i]) for i in order], chosen))
            return answers
        # room: multilabel end
        answers = []
        every = softmax(
            logits,
            self.calibration.temperature,  # room: calibration
        )
        for p in every:
            order = np.argsort(-p, kind="stable")[: min(top_k, len(names))]
            top, probs = [names[i] for i in order], [float(p[i]) for i in order]
            answers.append(Prediction(top[0], top, probs, [top[0]]))
        # room: unknown begin
        unknown, scored = self.calibration.verdict(outputs.plain)
        for i, answer in enumerate(answers):
            score = None if scored is None else float(scored[i])
            answers[i] = judged(answer, bool(unknown[i]), score, self.calibration)
        # room: unknown end
        return answers


class Stepped(NamedTuple):
    """What `CheckpointModel._answers` reads of a batch: the logits of predict's own step.
    # room: recipes begin
    Test-time augmentation included.
    # room: recipes end
    """

    logits: np.ndarray
    plain: Outputs | None = None  # the plain view's outputs, which the unknown verdict reads  # room: unknown


# room: unknown begin
def judged(answer: Prediction, refused: bool, score: float | None, calibration: Calibration) -> Prediction:
    """`answer` (a multi-class one) with its verdict: `unknown` or its class, the unknown score (None:
    the export has no threshold) and why (`Calibration.reason`)."""
    label = UNKNOWN if refused else answer.names[0]
    reason = "" if score is None else calibration.reason(score)
    labels = [] if refused else [label]
    return replace(answer, class_name=label, labels=labels, unknown=refused, score=score, reason=reason)


# room: unknown end


def as_input(image: Any) -> Path | bytes | np.ndarray:
    """A file (Path), its bytes, or uint8 RGB [H, W, 3]; anything else is refused with what to pass."""
    if isinstance(image, str | os.PathLike):
        return Path(image)
    if isinstance(image, bytes):
        return image
    if isinstance(image, Image.Image):
        return pil_rgb(image)  # the decoder's rule: upright, 16-bit scaled, transparency
    if isinstance(image, np.ndarray):
        return _checked_array(image)
    if type(image).__module__.startswith("torch"):
        raise TypeError(
            f"predict takes {KINDS}; got a torch tensor. Pass tensor.permute(1, 2, 0).numpy() of a uint8 "
            "[3, H, W] image, or call the model itself (`.model`) on uint8 batches [N, 3, H, W]."
        )
    raise TypeError(f"predict takes {KINDS}; got {type(image).__name__}.")


def _checked_array(array: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] from a uint8 [H, W, 3], [H, W, 4] (alpha dropped) or [H, W] array."""
    if array.dtype != np.uint8:
        if np.issubdtype(array.dtype, np.floating) and array.size and array.min() >= 0 and array.max() <= 1:
            hint = "(array * 255).round().astype(np.uint8)"
        else:
            hint = "array.astype(np.uint8) of values 0-255"
        raise ValueError(
            f"predict takes uint8 image arrays (values 0-255); got {array.dtype} with values from "
            f"{array.min() if array.size else 0:.3g} to {array.max() if array.size else 0:.3g}. Pass {hint}."
        )
    if array.ndim == 2:
        return np.repeat(array[..., None], 3, axis=2)
    if array.ndim == 3 and array.shape[2] in (3, 4) and min(array.shape[:2]) > 0:
        return np.ascontiguousarray(array[..., :3])
    if array.ndim == 3 and array.shape[0] in (3, 4):
        raise ValueError(
            f"predict takes arrays [H, W, 3] (height, width, RGB); got {list(array.shape)}, channels "
            "first. Pass array.transpose(1, 2, 0)."
        )
    raise ValueError(
        f"predict takes one image as an array [H, W, 3] (RGB) or [H, W] (gray); got {list(array.shape)}. "
        "Pass one image at a time to predict, or a list of them to predict_many."
    )
