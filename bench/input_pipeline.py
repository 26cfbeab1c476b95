"""Loader images/s: the template's input pipeline versus the classic torchvision one, step by step.

    python bench/input_pipeline.py [--images 256] [--camera 48] [--rounds 2]

Generates photo-like JPEGs (smooth colour fields, shapes and sensor noise, quality 90) in a
temporary folder: ImageNet-sized (400-640 x 300-480) and camera-sized (2048x1536). Then iterates a
DataLoader (batch 32, 0 and 2 workers) over each pipeline, alternating them, and prints the median
images/s and the ratio to the classic pipeline:

  classic          ImageFolder + Compose(RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
                   Normalize(...)): PIL decode, PIL resize, float tensors in the workers
  PIL + uint8 v2   PIL decode, then the template's uint8 transforms: the transforms' share
  float first      libjpeg-turbo decode, convert to float and normalize, then crop and resize
  template         the template's ImageDataset: libjpeg-turbo decode, crop and resize in uint8
  template + draft reduced-size JPEG decoding (PIL's draft mode: DCT scaling by 1/2, 1/4 or 1/8)
                   when the crop still has 224 px (eval: 256) after it, the template's decoder otherwise

and the same for evaluation (Resize(256) + CenterCrop(224)). The template's batches are uint8
(normalized later, on the device); the classic ones are float32 (4x the bytes per batch).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets
from torchvision import transforms as classic
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from project.data.dataset import ImageDataset
from project.data.decode import load_rgb
from project.data.folders import scan_folder
from project.data.transforms import eval_transform, train_transform

SIZE, RESIZE = 224, 256
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Photo-like content: compresses (and decodes) like a photo, unlike flat synthetic colour."""
    img = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(
        (width, height), Image.Resampling.BICUBIC
    )
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x, y, r = rng.integers(0, width), rng.integers(0, height), rng.integers(width // 20, width // 4)
        draw.ellipse((x - r, y - r, x + r, y + r), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    pixels = np.asarray(img.filter(ImageFilter.GaussianBlur(2)), dtype=np.int16)
    pixels = pixels + rng.normal(0, 8, pixels.shape).astype(np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def generate(root: Path, count: int, camera: bool) -> Path:
    rng = np.random.default_rng(0)
    for i in range(count):
        if camera:
            width, height = (2048, 1536) if i % 4 else (1536, 2048)
        else:
            width, height = int(rng.integers(400, 641)), int(rng.integers(300, 481))
        path = root / f"class{i % 4}" / f"{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        photo(rng, width, height).save(path, quality=90)
    return root


class PilUint8(Dataset):
    """PIL decode, then a uint8 tensor transform."""

    def __init__(self, root: Path, transform: Callable) -> None:
        self.index, self.transform = scan_folder(root), transform

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.index.path(i)) as img:
            image = F.pil_to_tensor(img.convert("RGB"))
        return self.transform(image), int(self.index.labels[i])


class FloatFirst(PilUint8):
    """libjpeg-turbo decode, float and normalized at full size, then crop and resize the floats."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = F.normalize(load_rgb(self.index.path(i)).float().div_(255), MEAN, STD)
        return self.transform(image), int(self.index.labels[i])


class Draft(PilUint8):
    """Reduced-size JPEG decoding: the crop is drawn on the full size first, then decoded at 1/s."""

    def __init__(self, root: Path, train: bool) -> None:
        super().__init__(root, None)
        self.crop = v2.RandomResizedCrop(SIZE, antialias=True)
        self.train = train

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path = self.index.path(i)
        with Image.open(path) as img:
            width, height = img.size
            top, left, h, w = self.box(width, height)
            need = min(h, w) / (SIZE if self.train else RESIZE)  # the decoded crop may shrink this much
            scale = max([s for s in (2, 4, 8) if s <= need] or [1])
            if scale > 1:
                img.draft("RGB", (math.ceil(width / scale), math.ceil(height / scale)))
                factor = img.size[0] / width  # the scale libjpeg chose
                image = F.pil_to_tensor(img.convert("RGB"))
        if scale == 1:  # no reduction possible: the template's own (faster) decoder
            image, factor = load_rgb(path), 1.0
        top, left, h, w = (round(v * factor) for v in (top, left, h, w))
        if self.train:
            image = F.resized_crop(image, top, left, h, w, [SIZE, SIZE], antialias=True)
            image = image.flip(-1) if torch.rand(1) < 0.5 else image
        else:
            image = F.center_crop(F.resize(image, RESIZE, antialias=True), SIZE)
        return image, int(self.index.labels[i])

    def box(self, width: int, height: int) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop in full-size pixels: RandomResizedCrop's own sampling."""
        if not self.train:
            return 0, 0, height, width
        params = self.crop.make_params([torch.empty(3, 1, 1).expand(3, height, width)])
        return params["top"], params["left"], params["height"], params["width"]


def pipelines(root: Path, train: bool) -> dict[str, Dataset]:
    if train:
        classic_t = [classic.RandomResizedCrop(SIZE), classic.RandomHorizontalFlip()]
        uint8_t = train_transform(SIZE)
        float_t = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()])
    else:
        classic_t = [classic.Resize(RESIZE), classic.CenterCrop(SIZE)]
        uint8_t = eval_transform(SIZE)
        float_t = v2.Compose([v2.Resize(RESIZE, antialias=True), v2.CenterCrop(SIZE)])
    to_float = [classic.ToTensor(), classic.Normalize(MEAN, STD)]
    return {
        "classic": datasets.ImageFolder(str(root), classic.Compose(classic_t + to_float)),
        "PIL + uint8 v2": PilUint8(root, uint8_t),
        "float first": FloatFirst(root, float_t),
        "template": ImageDataset(scan_folder(root), uint8_t),
        "template + draft": Draft(root, train),
    }


def images_per_second(dataset: Dataset, workers: int) -> float:
    loader = DataLoader(dataset, batch_size=32, num_workers=workers, shuffle=True)
    started = time.perf_counter()
    for _ in loader:
        pass
    return len(dataset) / (time.perf_counter() - started)


def run(root: Path, label: str, rounds: int) -> None:
    for train in (True, False):
        named = pipelines(root, train)
        for workers in (0, 2):
            rates: dict[str, list[float]] = {name: [] for name in named}
            for _ in range(rounds):
                for name, dataset in named.items():
                    rates[name].append(images_per_second(dataset, workers))
            base = statistics.median(rates["classic"])
            print(f"\n{label}, {'train' if train else 'eval'}, {workers} workers")
            for name, values in rates.items():
                rate = statistics.median(values)
                print(f"  {name:18s} {rate:8.1f} img/s  {rate / base:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=256, help="ImageNet-sized JPEGs")
    parser.add_argument("--camera", type=int, default=48, help="camera-sized JPEGs (2048x1536)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)  # per process, as in a loader worker
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        imagenet = generate(Path(tmp) / "imagenet", args.images, camera=False)
        camera = generate(Path(tmp) / "camera", args.camera, camera=True)
        print(f"generated {args.images} + {args.camera} JPEGs in {time.perf_counter() - started:.0f} s")
        run(imagenet, "ImageNet-sized (400-640 x 300-480)", args.rounds)
        run(camera, "camera-sized (2048x1536)", args.rounds)


if __name__ == "__main__":
    main()
