"""Classify image files with an exported model: onnxruntime (or OpenVINO), numpy and Pillow only.

    python -m project infer --model checkpoints/<run>/latest.onnx [--top_k 5] [--output CSV] FILE_OR_DIR...
                            [--unknown_accept SHARE]  # room: unknown

`--model` is the .onnx, or the OpenVINO IR (.xml) that `export --format openvino` writes beside it.
The sidecar JSON next to the model gives the class names and the image size; files are decoded
by training's rule (`project.data.decode`), the resize and centre crop match validation
(torchvision's Resize + CenterCrop), and the model itself normalizes. A file that cannot be
decoded is named on stderr with its reason, the others are still classified, and the exit status
is then 1. Probabilities are the softmax of the logits, as `predict` and `serve` give them.
# room: calibration begin
They are calibrated with the export's temperature by `project.deploy.calibration`.
# room: calibration end
Importing this module imports neither torch nor lightning.
# room: unknown begin

An image whose unknown score is below the export's threshold is answered `unknown` (its class
probabilities still listed, and the `reason` column saying why).
# room: unknown end
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any  # room: multilabel

from project.atomic import atomic_files
from project.data.decode import BadImageError  # numpy and Pillow only
from project.data.index import list_images  # numpy only: keeps this module free of torch
from project.deploy import prediction_csv
from project.deploy.classifier import Classifier

# room: unknown begin
from project.deploy.unknown import UNKNOWN

# room: unknown end
from project.errors import CommandParser, UserError, exits_on_user_error
from project.terminal import printable


def image_files(inputs: Sequence[str]) -> list[Path]:
    """Files as given; folders searched recursively for images (the same rules as training)."""
    files: list[Path] = []
    for item in map(Path, inputs):
        files += [item / f for f in list_images(item)] if item.is_dir() else [item]
    return files


@exits_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    parser = CommandParser(prog="python -m project infer", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="image files or folders (searched recursively)")
    parser.add_argument(
        "--model", required=True, help="exported .onnx or OpenVINO .xml file (its .json sidecar beside it)"
    )
    parser.add_argument(
        "--top_k",
        type=int,
        default=5,
        help="classes listed per image, 1 or more (at most the model's classes)",
    )
    parser.add_argument("--output", help="write a CSV here instead of printing")
    parser.add_argument(
        "--threads", type=int, default=None, help="inference threads (onnxruntime or OpenVINO)"
    )
    # room: unknown begin
    parser.add_argument(
        "--unknown_accept",
        type=float,
        default=None,
        help="share of validation images accepted; below the threshold this gives, an image is "
        "`unknown` (default: the export's, usually 0.95; 0: never unknown)",
    )
    # room: unknown end
    args = parser.parse_args(argv)
    if args.top_k < 1:  # 0 wrote rows without a class; -1 dropped the last one
        raise UserError(
            f"--top_k {args.top_k} is not a number of classes to list: it must be 1 or more.",
            "pass e.g. --top_k 5 (a number above the model's classes lists them all).",
        )
    # room: unknown begin
    if args.unknown_accept is not None and not 0 <= args.unknown_accept <= 1:
        raise UserError(
            f"--unknown_accept {args.unknown_accept} is not a share from 0 to 1.",
            "pass e.g. --unknown_accept 0.95, or 0 to never answer unknown.",
        )
    # room: unknown end
    classifier = Classifier(
        args.model,
        args.threads,
        args.unknown_accept,  # room: unknown
    )
    files = image_files(args.inputs)
    if not files:
        raise UserError(f"no image files in {args.inputs}.", "pass image files or folders of images.")
    bad: list[Path] = []

    def skip(path: Path, error: BadImageError) -> None:  # one line each, as soon as it is met
        bad.append(path)
        reason = printable(" ".join(error.reason.split()))
        print(f"error: cannot classify '{printable(str(path))}': {reason}", file=sys.stderr)

    if args.output is None:
        _print_rows(classifier, files, args.top_k, skip)
    else:
        rows = _write_csv(classifier, files, args.top_k, skip, Path(args.output))
        print(f"Wrote {rows} rows (one per image answered) to {printable(args.output)}")
    if bad:  # the run happened: status 1 (some inputs failed), not 2 (nothing done, a mistake to fix)
        print(
            f"error: {len(bad)} of {len(files)} files could not be classified (each named above); "
            f"the other {len(files) - len(bad)} were. Fix: replace or remove those files.",
            file=sys.stderr,
        )
        sys.exit(1)


def _print_rows(classifier: Classifier, files: list[Path], top_k: int, skip: Callable) -> None:
    tty = sys.stdout.isatty()
    if hasattr(sys.stdout, "reconfigure"):  # names that are not UTF-8 are printed as their bytes
        sys.stdout.reconfigure(errors=prediction_csv.ERRORS)
    for answer in classifier.classify(files, top_k, on_bad=skip):
        pairs = zip(answer.names, answer.probabilities, strict=True)
        cells = [str(answer.path), *(f"{n} {p:.4f}" for n, p in pairs)]
        if answer.unknown:  # room: unknown
            cells.insert(1, f"{UNKNOWN} ({answer.reason})")  # room: unknown
        line = "\t".join(cells)
        # on a terminal, names are escaped (as ls does); a pipe gets every name's exact bytes
        print("\t".join(map(printable, line.split("\t"))) if tty else line)


def _write_csv(classifier: Classifier, files: list[Path], top_k: int, skip: Callable, output: Path) -> int:
    """The CSV of the files that could be classified, at `output` only once complete; its row count."""
    with atomic_files(output) as [partial]:
        return _write_rows(classifier, files, top_k, skip, partial)


def _write_rows(classifier: Classifier, files: list[Path], top_k: int, skip: Callable, path: Path) -> int:
    rows = 0
    with prediction_csv.open_csv(path) as f:
        writer = csv.writer(f)
        names = classifier.class_names
        # room: multilabel begin
        if classifier.multilabel:
            return _write_label_rows(classifier, files, skip, writer)
        # room: multilabel end
        writer.writerow(prediction_csv.header(min(top_k, len(names))))
        for answer in classifier.classify(files, top_k, on_bad=skip):
            cells = (
                str(answer.path),
                answer.names,
                answer.probabilities,
                answer.class_name,  # room: unknown
                answer.reason,  # room: unknown
            )
            writer.writerow(prediction_csv.row(*cells))
            rows += 1
    return rows


# room: multilabel begin
def _write_label_rows(classifier: Classifier, files: list[Path], skip: Callable, writer: Any) -> int:
    """A multi-label model's rows: the labels at or above the threshold, every label's probability in
    label order."""
    rows = 0
    names = classifier.class_names
    writer.writerow(prediction_csv.multilabel_header(names))
    for path, top, probs, *_ in classifier.classify(files, len(names), on_bad=skip):
        by_name = dict(zip(top, probs, strict=True))
        ordered = [by_name[n] for n in names]
        writer.writerow(prediction_csv.multilabel_row(str(path), names, ordered, classifier.threshold))
        rows += 1
    return rows


# room: multilabel end
