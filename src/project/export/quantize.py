"""int8 export (`export --quantize int8`): onnxruntime static quantization, measured against the float model.

The float ONNX export is quantized in QDQ format, weights per channel (int8), activations per
tensor (uint8), the classification head left in float, with activation ranges calibrated on
training images preprocessed exactly as `infer` preprocesses (decode, resize, centre crop). It is
written beside the float model as `<name>-int8.onnx` with its own sidecar: the float sidecar plus
what was measured on the validation split (the share of images whose top-1 agrees with the float
model, the accuracy of each) and the latency of each at batch 1 and 8.
For a multi-label model the shares are of label decisions, at the sidecar's threshold.  # room: multilabel
Its temperature is fitted again on its own validation logits.  # room: calibration
`infer` and `serve` run it as any export.
Its unknown threshold is fitted again too, by the float export's score.  # room: unknown
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch  # room: calibration
from torch.utils.data import DataLoader

from project.atomic import atomic_files, atomic_symlink
from project.data.dataset import collate_skipping_none
from project.data.source import data_at_hand
from project.data.transforms import Interpolation, eval_transform

# room: unknown begin
from project.deploy.feature_bank import descriptors

# room: unknown end
from project.deploy.outputs import Outputs
from project.deploy.sidecar import Sidecar

# room: unknown begin
from project.deploy.unknown import FEATURE_SCORES

# room: unknown end
from project.errors import UserError
from project.export import (
    fit_calibration,  # room: calibration
    fit_unknown,  # room: unknown
    validation,
)

CALIBRATION_IMAGES = 256
LATENCY_BATCHES = (1, 8)


class TrainingImages:
    """onnxruntime's CalibrationDataReader over up to `count` training images, evenly spaced."""

    def __init__(
        self,
        datamodule: object,
        size: int,
        crop_ratio: float,
        count: int = CALIBRATION_IMAGES,
        interpolation: Interpolation = "bilinear",
    ):
        # --data.skip_bad_images holds here as in training: a file that does not decode is left out
        skip = bool(getattr(datamodule, "skip_bad_images", False))
        transform = eval_transform(size, crop_ratio, interpolation)
        dataset = data_at_hand(datamodule).samples("train", count, transform, skip)  # files or shards
        loader = DataLoader(dataset, batch_size=32, collate_fn=collate_skipping_none if skip else None)
        self._batches = validation.good_batches(loader)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        return None if batch is None else {"images": batch[0].numpy()}

    def rewind(self) -> None:  # quantize_static reads once
        pass


def quantize_export(onnx_path: Path, datamodule: object) -> Path:
    """Write `<stem>-int8.onnx` and its sidecar beside the float export `onnx_path`; returns its path."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    onnx_path = Path(onnx_path)
    float_sidecar = Sidecar.load(onnx_path.with_suffix(".json"))
    size, crop_ratio = float_sidecar.image_size, float_sidecar.crop_ratio
    interpolation = float_sidecar.interpolation
    try:
        data_at_hand(datamodule)
    except ValueError as e:
        raise UserError(
            f"--quantize int8 calibrates on training images, but {e}.",
            "pass --data.root=PATH of the training data, image files or shards (its train split is read).",
        ) from None
    final = onnx_path.with_name(f"{onnx_path.stem}-int8.onnx")
    sidecar = final.with_suffix(".json")
    with atomic_files(final, sidecar) as [partial, sidecar_partial]:
        with tempfile.TemporaryDirectory() as tmp:
            prepared = Path(tmp) / "prepared.onnx"
            quant_pre_process(str(onnx_path), str(prepared), skip_symbolic_shape=True)
            quantize_static(
                str(prepared),
                str(partial),
                TrainingImages(datamodule, size, crop_ratio, interpolation=interpolation),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                nodes_to_exclude=head_nodes(prepared),
            )
        meta = float_sidecar.to_dict()
        int8_meta = {**meta, "files": {"onnx": final.name}, "quantization": _quantization_notes()}
        int8_meta.update(measure(onnx_path, partial, datamodule, size, crop_ratio, meta))
        sidecar_partial.write_text(Sidecar.from_dict(int8_meta, sidecar).to_json())
    atomic_symlink(final.with_name("latest-int8.onnx"), final.name)
    atomic_symlink(final.with_name("latest-int8.json"), sidecar.name)
    print(
        summary(
            final,
            int8_meta,
            float_sidecar.multilabel,  # room: multilabel
        )
    )
    return final


def summary(
    final: Path,
    q: Mapping,
    multilabel: bool = False,  # room: multilabel
) -> str:
    """What `export --quantize int8` prints: agreement, accuracies and latency, or why not compared."""
    latency = f"batch 8 {q['latency_ms']['float']['8']:.2f} -> {q['latency_ms']['int8']['8']:.2f} ms"
    if q["agreement"] is None:
        return f"int8 model {final}: not compared with float ({q['measured']}); {latency}"
    what = "top-1 agrees"
    # room: multilabel begin
    if multilabel:
        what = "label decisions agree"
    # room: multilabel end
    return (
        f"int8 model {final}: {what} with float on {q['agreement']:.2%} of validation images, "
        f"accuracy {q['accuracy_float']:.4f} -> {q['accuracy_int8']:.4f}, {latency}"
    )


def head_nodes(model: Path) -> list[str]:
    """The classification head (the graph's last Gemm/MatMul), left in float.

    It is a sliver of the compute but decides the top-1: quantized, it flipped 1.7% of the answers
    of a CIFAR-10 resnet18, in float 0.9% (docs/benchmarks.md).
    """
    import onnx

    linear = [n.name for n in onnx.load(str(model)).graph.node if n.op_type in ("Gemm", "MatMul")]
    return linear[-1:]


def _quantization_notes() -> dict:
    return {
        "method": "onnxruntime quantize_static",
        "format": "QDQ",
        "weights": "int8, per channel",
        "activations": "uint8, per tensor, MinMax",
        "float": "the classification head (last Gemm/MatMul)",
        "calibration_images": f"up to {CALIBRATION_IMAGES} training images",
    }


def measure(
    float_path: Path, int8_path: Path, datamodule: object, size: int, crop_ratio: float, meta: Mapping
) -> dict:
    """Agreement and accuracy on the validation split, latency at batch 1 and 8, and the int8 calibration.

    `meta` is the float export's sidecar (its JSON object), checked here as every reader checks it.
    """
    float_sidecar = Sidecar.from_dict(meta, Path(float_path).with_suffix(".json"))
    float_session, int8_session = _session(float_path), _session(int8_path)
    result: dict = {"latency_ms": latency({"float": float_session, "int8": int8_session}, size)}
    try:
        loader = validation.validation_loader(
            datamodule, size, crop_ratio, interpolation=float_sidecar.interpolation
        )
    except ValueError as e:
        return not_measured(result, str(e))
    names = ["logits"]
    # room: unknown begin
    features = float_sidecar.unknown_score in FEATURE_SCORES  # the int8 model's, for its own threshold
    names += ["features"] if features else []
    int8_features = []
    # room: unknown end
    float_logits, int8_logits, labels = [], [], []
    for images, targets in validation.good_batches(loader):
        batch = images.numpy()
        float_logits.append(float_session.run(["logits"], {"images": batch})[0])
        int8_outputs = Outputs.of(names, int8_session.run(names, {"images": batch}))
        int8_logits.append(int8_outputs.logits)
        # room: unknown begin
        int8_features.append(None if not features else descriptors(int8_outputs.features, batch))
        # room: unknown end
        labels.append(targets.numpy())
    if not labels:  # --data.skip_bad_images left every one out: nothing to compare
        return not_measured(
            result, "every validation image was skipped as unreadable (--data.skip_bad_images)"
        )
    f, q, y = np.concatenate(float_logits), np.concatenate(int8_logits), np.concatenate(labels)
    float_answer, int8_answer = answers(f, float_sidecar), answers(q, float_sidecar)
    result |= {
        "agreement": agreement(float_answer, int8_answer),
        "accuracy_float": agreement(float_answer, y),
        "accuracy_int8": agreement(int8_answer, y),
        "validation_images": len(y),
    }
    # room: multilabel begin
    if float_sidecar.multilabel:
        result["measured_as"] = "share of label decisions (at the sidecar's threshold) that agree"
        return result
    # room: multilabel end
    # room: calibration begin
    if float_sidecar.reliability is not None:  # the float export was calibrated
        logits, labels = torch.from_numpy(q), torch.from_numpy(y)
        temperature = fit_calibration.fit_temperature(logits, labels)
        if temperature >= fit_calibration.MAX_TEMPERATURE:  # refused as for the float model
            result |= fit_calibration.skipped(fit_calibration.flattening(logits, labels))
        else:
            result |= fit_calibration.calibrate(logits, labels, temperature)
            # room: unknown begin
            if float_sidecar.unknown_score is not None:
                result |= own_threshold(float_sidecar, int8_features, logits, labels, temperature)
            # room: unknown end
    # room: calibration end
    return result


# room: unknown begin
def own_threshold(
    float_sidecar: Sidecar, features: list, logits: torch.Tensor, labels: torch.Tensor, temperature: float
) -> dict:
    """The int8 model's unknown keys at its own `temperature`, by the float export's score: the float
    export's choice of score and its figures stand, only the threshold is the int8 model's own."""
    with_features = float_sidecar.unknown_score in FEATURE_SCORES
    evidence = fit_unknown.Evidence(
        np.concatenate(features) if with_features else None,
        float_sidecar.bank() if with_features else None,
    )
    asked = fit_unknown.Request(float_sidecar.unknown_accept, float_sidecar.unknown_score, evidence)
    figures = ("unknown_scores", "unknown_choice", "unknown_foreign_images")
    keys = asked.keys(logits, labels, temperature)
    return {key: value for key, value in keys.items() if key not in figures}


# room: unknown end


def not_measured(result: dict, reason: str) -> dict:
    """The measurement keys of an int8 export that could not be compared with the float one, and why."""
    return {**result, "agreement": None, "accuracy_float": None, "accuracy_int8": None, "measured": reason}


def answers(logits: np.ndarray, sidecar: Sidecar) -> np.ndarray:
    """What a model answers: the top-1 class [N]."""
    # room: multilabel begin
    if sidecar.multilabel:  # the label decisions [N, C] (0/1)
        with np.errstate(over="ignore"):  # exp(-logit) of a very negative logit: inf, a probability of 0
            probabilities = 1 / (1 + np.exp(-logits.astype(np.float64)))
        return (probabilities >= sidecar.threshold).astype(np.uint8)
    # room: multilabel end
    return logits.argmax(1)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """The share of answers (top-1 classes, or label decisions) that are equal."""
    return float((a == np.asarray(b).astype(a.dtype)).mean())


def latency(sessions: dict[str, object], size: int, repeats: int = 20) -> dict[str, dict[str, float]]:
    """Median milliseconds per call of each session at each batch size of LATENCY_BATCHES.

    The sessions take turns call by call (after 3 warm-up calls each), so that other work on the
    machine slows both alike.
    """
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {name: {} for name in sessions}
    for batch in LATENCY_BATCHES:
        images = rng.integers(0, 256, (batch, 3, size, size), dtype=np.uint8)
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for repeat in range(3 + repeats):
            for name, session in sessions.items():
                start = time.perf_counter()
                session.run(["logits"], {"images": images})
                if repeat >= 3:
                    times[name].append(time.perf_counter() - start)
        for name in sessions:
            out[name][str(batch)] = float(np.median(times[name]) * 1000)
    return out


def _session(path: Path) -> object:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
