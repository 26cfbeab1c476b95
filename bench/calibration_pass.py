"""The export's calibration pass over the validation images: where its time goes, and the cheaper ways.

    python bench/calibration_pass.py --root DATA [--backbone resnet18 --image_size 32 --rounds 3]

DATA has train/ and val/. Times, alternating, in one process (imports and model building
excluded), the ways of getting the validation logits that `calibrate_export` needs:

- shipped: `validation_loader` (decoding the files in `num_workers` fresh worker processes) and the
  eager model, as the export at the end of `fit` does now;
- cached, eager: the data module's decoded validation images (`--data.cache`), no workers;
- files, onnxruntime: the shipped loader, logits from the exported ONNX model instead.

Prints the medians and the ratios against the shipped pass.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import onnxruntime as ort
import torch
from torch.utils.data import DataLoader

from project.data.datamodule import ImageDataModule
from project.data.dataset import ImageDataset
from project.data.transforms import eval_transform
from project.export.deployable import Deployable, dynamic_batch, example_batch
from project.export.onnx_target import write_torch_export
from project.export.validation import collect_logits, validation_loader
from project.model import ImageClassifier


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", required=True)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    data = ImageDataModule(root=args.root, image_size=args.image_size, num_workers=2, cache=True)
    data.setup("fit")
    model = ImageClassifier(num_classes=data.num_classes, backbone=args.backbone, image_size=args.image_size)
    deployable = Deployable(model).eval()
    program = torch.export.export(
        deployable, (example_batch(args.image_size),), dynamic_shapes=dynamic_batch()
    )
    onnx = Path(tempfile.mkdtemp()) / "model.onnx"
    write_torch_export(program, args.image_size, onnx, 18)  # as the export writes it
    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])

    def shipped() -> torch.Tensor:
        return collect_logits(deployable, validation_loader(data, args.image_size, 0.875))[0]

    def cached() -> torch.Tensor:
        dataset = ImageDataset(
            data.splits["val"], eval_transform(args.image_size, 0.875), cache=data.decoded["val"]
        )
        return collect_logits(deployable, DataLoader(dataset, batch_size=64))[0]

    def onnxruntime() -> torch.Tensor:
        loader = validation_loader(data, args.image_size, 0.875)
        return torch.cat(
            [torch.from_numpy(session.run(["logits"], {"images": x.numpy()})[0]) for x, _ in loader]
        )

    ways = {"shipped": shipped, "cached, eager": cached, "files, onnxruntime": onnxruntime}
    times: dict[str, list[float]] = {name: [] for name in ways}
    reference = shipped()
    for round_ in range(args.rounds):
        for name in list(ways)[round_ % 3 :] + list(ways)[: round_ % 3]:
            started = time.perf_counter()
            logits = ways[name]()
            times[name].append(time.perf_counter() - started)
            assert torch.allclose(logits, reference, atol=1e-3), name
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, seconds in medians.items():
        print(f"{name:<20} median {seconds:.2f} s  ({', '.join(f'{t:.2f}' for t in times[name])})")
    for name in list(ways)[1:]:
        print(f"shipped / {name}: {medians['shipped'] / medians[name]:.2f}x")


if __name__ == "__main__":
    main()
