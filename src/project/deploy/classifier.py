"""An exported model with its sidecar, ready to classify: onnxruntime (or OpenVINO), numpy and Pillow only.

`infer` (files -> CSV) and `serve` (HTTP) both answer through `Classifier`: the same decoding as
training (`project.data.decode`), the resize and centre crop of validation, and the softmax of the
logits (`project.deploy.outputs`).
# room: calibration begin
The softmax is taken at the export's temperature (`project.deploy.calibration`).
# room: calibration end
`open_session` opens an .onnx file with onnxruntime, and another export's file with the runtime
RUNTIMES names for its suffix. Importing this module imports neither torch nor lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from importlib import import_module
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from project.data.decode import BadImageError, decode_rgb, read_rgb  # numpy and Pillow only

# room: unknown begin
from project.deploy.feature_bank import descriptors

# room: unknown end
from project.deploy.outputs import Outputs, softmax
from project.deploy.sidecar import Sidecar

# room: unknown begin
from project.deploy.unknown import UNKNOWN

# room: unknown end
from project.errors import UserError

# Export files other than .onnx, by suffix: (their key in the sidecar's `files`, the module whose
# `Session(path, threads)` runs them with onnxruntime's call shape `run(["logits"], {"images": batch})`)
RUNTIMES = {
    # room: openvino begin
    ".xml": ("openvino", "project.deploy.openvino_runtime"),
    # room: openvino end
}

# The sidecar's resize filters (project.deploy.sidecar.INTERPOLATIONS) as Pillow's
RESAMPLING = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


class Answer(NamedTuple):
    """One image's answer: its top-k classes and probabilities.

    Also whether it is `unknown`, its unknown score and why.  # room: unknown
    """

    path: Path
    names: list[str]
    probabilities: list[float]
    # room: unknown begin
    unknown: bool = False
    score: float | None = None  # the unknown score, when the export has a threshold
    reason: str = ""  # why it is `unknown` (Calibration.reason); "" when it is not
    # room: unknown end

    @property
    def class_name(self) -> str:
        """The answer: the top class."""
        if self.unknown:  # room: unknown
            return UNKNOWN  # room: unknown
        return self.names[0]


class Classifier:
    """An export and its sidecar: `classify(paths)` -> Answer per file (top-k names, probabilities).

    # room: unknown begin
    `unknown_accept` overrides the share of validation images the export's unknown threshold
    accepts (0: never answer `unknown`).
    # room: unknown end
    """

    def __init__(
        self,
        model: str | Path,
        threads: int | None = None,
        unknown_accept: float | None = None,  # room: unknown
    ) -> None:
        model = Path(model)
        sidecar = model.with_suffix(".json")
        if not model.is_file() or not sidecar.is_file():
            raise UserError(
                f"Need the model and its sidecar: '{model}' and '{sidecar}'.",
                "pass an .onnx (or an OpenVINO .xml) written by `python -m project export`.",
            )
        self.sidecar = Sidecar.load(sidecar)  # every value below is checked there
        self.class_names = list(self.sidecar.class_names)
        self.task = self.sidecar.task
        self.threshold = self.sidecar.threshold  # room: multilabel
        self.size = self.sidecar.image_size
        self.resize_to = self.sidecar.resize_to
        # Pillow's filters are the ones torch's antialiased uint8 resize reproduces (within a grey level)
        self.resample = RESAMPLING[self.sidecar.interpolation]
        # room: calibration begin
        self.calibration = self.sidecar.calibration(
            unknown_accept,  # room: unknown
        )
        # room: calibration end
        self.session = open_session(model, threads)
        self.outputs = [output.name for output in self.session.get_outputs()]  # room: unknown
        self._check_fits(model, sidecar)

    def _check_fits(self, model: Path, sidecar: Path) -> None:
        """Run one blank image: the model must take the sidecar's image size and give a logit per class.

        Also the warm-up: the first run allocates and plans, here rather than in the first request.
        """
        fix = "keep each export's .onnx and .json together as `python -m project export` wrote them."
        # room: unknown begin
        if self.calibration.needs_features and "features" not in self.outputs:
            raise UserError(
                f"Model '{model}' has no 'features' output, but its sidecar '{sidecar}' answers `unknown` "
                f"by the {self.calibration.score_name} score, which needs them.",
                fix,
            )
        # room: unknown end
        try:
            outputs = self.run(np.zeros((1, 3, self.size, self.size), dtype=np.uint8))
            logits = outputs.logits
        except Exception as e:  # onnxruntime's own types: wrong input name, size or type
            raise UserError(
                f"Model '{model}' does not take the input its sidecar '{sidecar}' describes "
                f"(uint8 images [N, 3, {self.size}, {self.size}] named 'images', logits out): "
                f"{' '.join(str(e).split())[:300]}.",
                fix,
            ) from None
        if logits.shape != (1, len(self.class_names)):
            raise UserError(
                f"Model '{model}' gives {logits.shape[-1]} logits per image, but its sidecar '{sidecar}' "
                f"names {len(self.class_names)} classes in 'class_names'.",
                fix,
            )
        # room: unknown begin
        bank = self.calibration.bank
        if bank is not None and outputs.features.shape != (1, bank.dim):
            raise UserError(
                f"Model '{model}' gives {outputs.features.shape[-1] - bank.dim + bank.blocks[0][1]} features "
                f"per image, but the feature bank its sidecar '{sidecar}' names holds {bank.blocks[0][1]}.",
                fix,
            )
        # room: unknown end

    # room: multilabel begin
    @property
    def multilabel(self) -> bool:
        """Any number of labels per image (a sigmoid each), as the sidecar's `task` says; else one class."""
        return self.sidecar.multilabel

    # room: multilabel end

    def preprocess(self, image: str | Path | bytes | Image.Image) -> np.ndarray:
        """uint8 [3, size, size]: decoded as training decodes, short side resized, centre-cropped.

        `image` is a file, its bytes, or an image already decoded by `project.data.decode`
        (whose BadImageError says why a file cannot be used).
        """
        if isinstance(image, Image.Image):
            img = image.convert("RGB")
        elif isinstance(image, bytes):
            img = Image.fromarray(decode_rgb(image, "the image"))
        else:
            img = Image.fromarray(read_rgb(Path(image)))
        width, height = img.size
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(self.resize_to * long / short)  # torchvision's rounding
        new_size = (self.resize_to, new_long) if width <= height else (new_long, self.resize_to)
        img = img.resize(new_size, self.resample, reducing_gap=None)
        left = round((img.width - self.size) / 2.0)
        top = round((img.height - self.size) / 2.0)
        img = img.crop((left, top, left + self.size, top + self.size))
        return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)

    def logits(self, batch: np.ndarray) -> np.ndarray:
        """The model's logits [N, C] of a uint8 batch [N, 3, size, size]."""
        return self.session.run(["logits"], {"images": batch})[0]

    def run(
        self,
        batch: np.ndarray,
        features: bool | None = None,  # room: unknown
    ) -> Outputs:
        """The model's outputs for a uint8 batch [N, 3, size, size]: its logits [N, C].

        # room: unknown begin
        And its features where `features` asks (by default: where the unknown score needs them), beside
        the images' statistics (`feature_bank.descriptors`).
        # room: unknown end
        """
        # room: unknown begin
        if self.calibration.needs_features if features is None else features:
            names = ["logits", "features"]
            outputs = Outputs.of(names, self.session.run(names, {"images": batch}))
            return Outputs(outputs.logits, descriptors(outputs.features, batch))
        # room: unknown end
        return Outputs(self.logits(batch))

    def probabilities_of(self, logits: np.ndarray) -> np.ndarray:
        """Probabilities of logits [N, C]: their softmax.

        The logits are divided by the export's temperature first.  # room: calibration
        """
        # room: multilabel begin
        if self.multilabel:  # independent labels: a sigmoid each
            return 1 / (1 + np.exp(-logits))
        # room: multilabel end
        return softmax(
            logits,
            self.calibration.temperature,  # room: calibration
        )

    def probabilities(self, batch: np.ndarray) -> np.ndarray:
        return self.probabilities_of(self.logits(batch))

    # room: unknown begin
    def unknown(self, outputs: Outputs) -> tuple[np.ndarray, np.ndarray | None]:
        """(bool [N]: answered `unknown`, the unknown scores [N] or None when there is no threshold)."""
        # room: multilabel begin
        if self.multilabel:
            return np.zeros(len(outputs.logits), dtype=bool), None
        # room: multilabel end
        return self.calibration.verdict(outputs)

    # room: unknown end

    def top(self, probabilities: np.ndarray, k: int) -> tuple[list[str], list[float]]:
        """The k most probable class names of one image, most probable first, and their probabilities."""
        top = np.argsort(-probabilities, kind="stable")[: min(k, len(self.class_names))]
        return [self.class_names[i] for i in top], [float(probabilities[i]) for i in top]

    def classify(
        self,
        paths: Sequence[Path],
        top_k: int = 5,
        batch_size: int = 32,
        on_bad: Callable[[Path, BadImageError], None] | None = None,
    ) -> Iterator[Answer]:
        """An Answer per file, in order.

        A file that cannot be decoded raises BadImageError, or, with `on_bad`, is handed to it and
        left out while the others are classified.
        """
        if isinstance(paths, str | Path):  # a string would be classified a character at a time
            raise TypeError(f"classify takes a list of image files; got one: {str(paths)!r}. Pass [path].")
        for start in range(0, len(paths), batch_size):
            chunk, arrays = [], []
            for path in paths[start : start + batch_size]:
                try:
                    arrays.append(self.preprocess(path))
                except BadImageError as e:
                    if on_bad is None:
                        raise
                    on_bad(path, e)
                    continue
                chunk.append(path)
            if not chunk:
                continue
            outputs = self.run(np.stack(arrays))
            answers = [
                Answer(path, *self.top(p, top_k))
                for path, p in zip(chunk, self.probabilities_of(outputs.logits), strict=True)
            ]
            answers = self.with_verdicts(answers, outputs)  # room: unknown
            yield from answers

    # room: unknown begin
    def with_verdicts(self, answers: list[Answer], outputs: Outputs) -> list[Answer]:
        """`answers` with whether each is `unknown`, its unknown score and why."""
        unknown, scores = self.unknown(outputs)
        said = []
        for i, answer in enumerate(answers):
            score = None if scores is None else float(scores[i])
            reason = "" if score is None else self.calibration.reason(score)
            said.append(answer._replace(unknown=bool(unknown[i]), score=score, reason=reason))
        return said

    # room: unknown end


def kind_of(model: str | Path) -> str:
    """The sidecar's `files` key of an export's file: `onnx`, or its runtime's (RUNTIMES)."""
    return RUNTIMES.get(Path(model).suffix.lower(), ("onnx", ""))[0]


def open_session(model: Path, threads: int | None = None) -> object:
    """An inference session for `model`: onnxruntime for an .onnx, else its runtime's (RUNTIMES); each
    answers `run` as onnxruntime does."""
    if (runtime := RUNTIMES.get(Path(model).suffix.lower())) is not None:
        return import_module(runtime[1]).Session(model, threads)
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own types (InvalidProtobuf, Fail, ...)
        raise UserError(
            f"onnxruntime cannot load '{model}': {e}.",
            "export the checkpoint again with `python -m project export`.",
        ) from None
