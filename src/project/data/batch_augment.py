"""The training augmentation of `transforms.train_transform`, applied to a whole uint8 batch at once.

torchvision's v2 transforms take one image per call; on a 32x32 image the calls cost ~300 µs
(RandomResizedCrop, flip, TrivialAugment), more than decoding it, so once the images are cached
(`--data.cache`) the per-image calls are most of an epoch. `BatchAugment` draws the same random
parameters for a whole batch in a few tensor calls and applies them with one call per step:

- **Crops** follow `v2.RandomResizedCrop.make_params`: up to 10 tries of an area (uniform in
  `scale`) and a log aspect ratio (uniform in log `ratio`), the first that fits at a uniform
  integer offset, else the centre crop clamped to the ratio range. Each crop is resized to
  `size` x `size` by two matrices per image (rows, columns) holding the weights of torch's
  antialiased resize (`_upsample_bilinear2d_aa`: a triangle filter; `_upsample_bicubic2d_aa`:
  Keys' cubic with a = -0.5, as Pillow's; each widened by the scale when shrinking, renormalized
  at the crop's edges): `rows @ image @ columns^T`, batched matmuls (`resize`).
- **Flips** reverse the column matrix of the flipped images (flip after resize, as v2 does).
- **TrivialAugment** (`auto_augment="trivialaugment"`): one operation per image, uniform over
  torchvision's table (`TrivialAugmentWide._AUGMENTATION_SPACE`, so the operations and their
  magnitudes are torchvision's), a uniform magnitude bin and a random sign where signed.
  RandAugment: two operations per image at its fixed magnitude (bin 9 of 31). The images are
  grouped by operation, and each group is transformed at once with one magnitude per image:
  affine operations (shear, translate, rotate) by one grid per image and `grid_sample`
  (nearest, zero fill), colour operations as torchvision computes them, with the factor
  broadcast per image.

Each step matches torchvision's per-image result on the same input to within one grey level
(uint8 resize rounding) and the random parameters have the same distribution
(tests/test_batch_augment.py);
the random streams differ, so a run is reproducible but not the same run as per-image transforms.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn.functional import conv2d, grid_sample
from torch.utils.data import Dataset
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from project.data.decoded import DecodedImages
from project.data.index import ImageIndex
from project.data.transforms import AutoAugment, Interpolation

# a batch at a time only up to this many pixels an image: the resize matrices span the whole source
# image, so past it the per-image crop (which reads only the crop) is faster (tests/test_batch_augment.py)
MAX_PIXELS = 128 * 128
MAGNITUDE_BINS = 31  # torchvision's default for both TrivialAugmentWide and RandAugment
RANDAUGMENT_OPS, RANDAUGMENT_MAGNITUDE = 2, 9  # RandAugment's defaults
AFFINE = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


class BatchAugment:
    """RandomResizedCrop to `size`, optional flip and TrivialAugment/RandAugment on [N, 3, H, W] uint8.

    Args:
        size: Side of the square output.
        scale: RandomResizedCrop's area range.
        ratio: RandomResizedCrop's aspect-ratio range.
        hflip: Flip half of the images horizontally.
        auto_augment: none, trivialaugment or randaugment, as in `train_transform`.
        interpolation: The crops' resize filter, bilinear or bicubic, as in `train_transform`.
    """

    def __init__(
        self,
        size: int,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        hflip: bool = True,
        auto_augment: AutoAugment = "none",
        interpolation: Interpolation = "bilinear",
    ) -> None:
        self.size = size
        self.interpolation = interpolation
        self.scale = scale
        self.ratio = ratio
        self.hflip = hflip
        self.auto_augment = auto_augment

    @property
    def space(self) -> dict:
        """torchvision's table of operations: name -> (magnitudes(bins, height, width), signed).

        Read from the class each time, not kept: its lambdas cannot be pickled, and spawned loader
        workers receive this object pickled.
        """
        classes = {"trivialaugment": v2.TrivialAugmentWide, "randaugment": v2.RandAugment}
        space = classes.get(self.auto_augment)
        return space._AUGMENTATION_SPACE if space is not None else {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        n, _, height, width = images.shape
        top, left, h, w = self.crops(n, height, width)
        rows = resize_weights(top, h, height, self.size, self.interpolation)
        columns = resize_weights(left, w, width, self.size, self.interpolation)
        if self.hflip:
            flipped = torch.rand(n) < 0.5  # v2.RandomHorizontalFlip's p=0.5
            columns[flipped] = columns[flipped].flip(1)
        out = resize(images, rows, columns, self.interpolation)
        if self.auto_augment == "trivialaugment":
            out = self.operations(out, bins=torch.randint(MAGNITUDE_BINS, (n,)))
        elif self.auto_augment == "randaugment":
            for _ in range(RANDAUGMENT_OPS):
                out = self.operations(out, bins=torch.full((n,), RANDAUGMENT_MAGNITUDE))
        return out

    def crops(self, n: int, height: int, width: int) -> tuple[torch.Tensor, ...]:
        """(top, left, height, width) of `n` crops, int64 each, drawn as RandomResizedCrop draws one."""
        tries = 10
        area = height * width * torch.empty(n, tries, dtype=torch.float64).uniform_(*self.scale)
        log_ratio = torch.empty(n, tries, dtype=torch.float64).uniform_(*map(math.log, self.ratio))
        aspect = torch.exp(log_ratio)
        # round half to even, as Python's round() in make_params
        w = torch.round(torch.sqrt(area * aspect)).long()
        h = torch.round(torch.sqrt(area / aspect)).long()
        fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
        first = fits.int().argmax(1)  # the first try that fits (0 when none does: replaced below)
        w, h = w.gather(1, first[:, None])[:, 0], h.gather(1, first[:, None])[:, 0]
        fallback = ~fits.any(1)
        if fallback.any():
            cw, ch = self._centre_crop(height, width)
            w[fallback], h[fallback] = cw, ch
        top = (torch.rand(n, dtype=torch.float64) * (height - h + 1)).long()
        left = (torch.rand(n, dtype=torch.float64) * (width - w + 1)).long()
        top[fallback], left[fallback] = (height - h[fallback]) // 2, (width - w[fallback]) // 2
        return top, left, h, w

    def _centre_crop(self, height: int, width: int) -> tuple[int, int]:
        """make_params' fallback: the whole image, clamped to the ratio range."""
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            return width, round(width / min(self.ratio))
        if in_ratio > max(self.ratio):
            return round(height * max(self.ratio)), height
        return width, height

    def operations(self, images: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
        """One operation per image, uniform over the table, at magnitude bin `bins[i]`, sign at random."""
        n, _, height, width = images.shape
        space = self.space
        names = list(space)
        chosen = torch.randint(len(names), (n,))
        negative = torch.rand(n) <= 0.5  # v2 negates a signed magnitude when rand() <= 0.5
        out = images.clone()
        for k, name in enumerate(names):
            members = (chosen == k).nonzero()[:, 0]
            if not len(members) or name == "Identity":
                continue
            magnitudes_fn, signed = space[name]
            table = magnitudes_fn(MAGNITUDE_BINS, height, width)
            magnitude = table[bins[members]].double() if table is not None else torch.zeros(len(members))
            if signed:
                magnitude = torch.where(negative[members], -magnitude, magnitude)
            out[members] = apply(name, images[members], magnitude)
        return out


def resize_weights(
    start: torch.Tensor,
    length: torch.Tensor,
    source: int,
    size: int,
    interpolation: Interpolation = "bilinear",
) -> torch.Tensor:
    """[N, size, source] weights resizing each image's [start, start + length) to `size` along one axis.

    torch's antialiased resize (`_compute_indices_min_size_weights_aa`): output o is centred at
    scale * (o + 0.5) with scale = length / size; the filter (bilinear: a triangle over 1 px on either
    side; bicubic: Keys' cubic, a = -0.5, over 2 px) is widened by max(scale, 1); the weights inside the
    crop are renormalized to sum to 1.
    """
    scale = (length.double() / size)[:, None, None]
    support = scale.clamp(min=1.0)
    centre = scale * (torch.arange(size, dtype=torch.float64)[None, :, None] + 0.5)
    local = torch.arange(source, dtype=torch.float64)[None, None, :] - start[:, None, None]
    distance = ((local + 0.5 - centre) / support).abs()
    weights = _cubic(distance) if interpolation == "bicubic" else (1 - distance).clamp_(min=0)
    weights *= (local >= 0) & (local < length[:, None, None])
    return (weights / weights.sum(2, keepdim=True)).float()


def resize(
    images: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor, interpolation: Interpolation
) -> torch.Tensor:
    """uint8 `images` [N, C, H, W] resized by `resize_weights`' matrices: `rows @ image @ columns^T`.

    The cubic filter overshoots: as torch's and Pillow's uint8 resizes do, the columns are resized
    first and stored as uint8 (rounded, clipped to 0..255), then the rows. A triangle filter cannot
    overshoot, and one float product is within a grey level of theirs.
    """
    if interpolation == "bicubic":
        wide = (images.float() @ columns.transpose(1, 2).unsqueeze(1)).round_().clamp_(0, 255)
        out = rows.unsqueeze(1) @ wide
    else:
        out = rows.unsqueeze(1) @ images.float() @ columns.transpose(1, 2).unsqueeze(1)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def _cubic(x: torch.Tensor, a: float = -0.5) -> torch.Tensor:
    """Keys' cubic convolution kernel at distances `x` >= 0 (zero from 2 on): torch's antialiased
    bicubic filter (`aa_filter` with a = -0.5) and Pillow's."""
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def apply(name: str, images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """torchvision's `_apply_image_or_video_transform(name, magnitude)` with one magnitude per image."""
    if name in AFFINE:
        return _affine(name, images, magnitude)
    m = magnitude.float().view(-1, 1, 1, 1)  # factors are 1 + m; v2 blends with weight 1 - factor = -m
    if name == "Brightness":
        return (images * (1 + m)).clamp_(0, 255).to(torch.uint8)
    if name == "Color":
        return _blend(images, _grey(images), m)
    if name == "Contrast":
        return _blend(images, _grey(images).mean(dim=(-3, -2, -1), keepdim=True), m)
    if name == "Sharpness":
        return _sharpen(images, m)
    if name == "Posterize":
        bits = magnitude.long().view(-1, 1, 1, 1)
        mask = ((1 << bits) - 1) << (8 - bits)  # 8 bits: 255, the image unchanged
        return images & mask.to(torch.uint8)
    if name == "Solarize":  # v2: 255 * float(magnitude) in double, compared in float32
        threshold = (255 * magnitude).float().view(-1, 1, 1, 1)
        return torch.where(images >= threshold, 255 - images, images)
    if name == "AutoContrast":
        return F.autocontrast(images)  # per image and channel already
    if name == "Equalize":
        return F.equalize(images)
    raise ValueError(f"No batched transform for {name}")


def _grey(images: torch.Tensor) -> torch.Tensor:
    """v2's grey image for Color and Contrast: its weights, floored (uint8 truncation is the floor)."""
    return F.rgb_to_grayscale(images).float()


def _blend(images: torch.Tensor, other: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """v2's _blend with ratio 1 + m: images * (1 + m) + other * -m, clamped, truncated to uint8."""
    return (images * (1 + m) + other * -m).clamp_(0, 255).to(torch.uint8)


def _sharpen(images: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """adjust_sharpness by 1 + m: the interior blended with a rounded 3x3 blur (5 in the centre, 1 around)."""
    channels = images.shape[-3]
    a, b = 1 / 13, 5 / 13
    kernel = torch.tensor([[a, a, a], [a, b, a], [a, a, a]]).expand(channels, 1, 3, 3)
    out = images.float()
    blurred = conv2d(out, kernel, groups=channels).round_()
    inner = out[..., 1:-1, 1:-1]
    inner.add_((blurred - inner) * -m)
    return out.clamp_(0, 255).to(torch.uint8)


def _affine(name: str, images: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """Shear, translate or rotate each image by its magnitude: nearest neighbour, zeros outside.

    The inverse matrices are `F.affine`'s (`_get_inverse_affine_matrix`) for the arguments the
    auto-augment table passes: shears about the top-left corner, translations by whole pixels,
    rotations about the centre.
    """
    n, _, height, width = images.shape
    zero = torch.zeros(n, dtype=torch.float64)
    cx = cy = tx = ty = rot = sx = sy = zero
    if name in ("ShearX", "ShearY"):
        cx, cy = zero - width * 0.5, zero - height * 0.5  # center=[0, 0] in F.affine's coordinates
        shear = torch.atan(magnitude)  # the table's magnitude is tan(shear)
        sx, sy = (shear, zero) if name == "ShearX" else (zero, shear)
    elif name == "TranslateX":
        tx = magnitude.trunc()
    elif name == "TranslateY":
        ty = magnitude.trunc()
    else:
        rot = -torch.deg2rad(magnitude)  # F.rotate passes -angle: its direction is affine's opposite
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -(a * torch.tan(sx) + torch.sin(rot))
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = torch.cos(rot) - c * torch.tan(sx)
    theta = torch.stack([d, -b, zero, -c, a, zero], 1)
    theta[:, 2] += cx - theta[:, 0] * (cx + tx) - theta[:, 1] * (cy + ty)
    theta[:, 5] += cy - theta[:, 3] * (cx + tx) - theta[:, 4] * (cy + ty)
    theta = theta.float().view(n, 2, 3)
    # F._affine_grid: pixel centres relative to the image centre, mapped, then normalized to [-1, 1]
    xs = torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, width)
    ys = torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, height)
    base = torch.stack(
        [xs.expand(height, width), ys[:, None].expand(height, width), torch.ones(height, width)], -1
    )
    scaled = theta.transpose(1, 2) / torch.tensor([0.5 * width, 0.5 * height])
    grid = base.view(1, height * width, 3).expand(n, -1, -1).bmm(scaled).view(n, height, width, 2)
    out = grid_sample(images.float(), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.round_().to(torch.uint8)


class CachedBatches(Dataset):
    """Training batches of a cached split whose images share one shape, augmented a batch at a time.

    The DataLoader hands each worker a batch's indices (`__getitems__`): the images are gathered
    from the decoded buffer with one index and `augment` runs once on the uint8 batch, instead of
    one transform call per image (`BatchAugment`). Files that failed to decode (skipped at
    setup) are left out of their batch. Use with `collate_fn=whole_batch`.
    """

    def __init__(self, index: ImageIndex, cache: DecodedImages, augment: BatchAugment) -> None:
        shape = uniform_shape(cache)
        if shape is None:
            raise ValueError("CachedBatches needs decoded images of one shape (uniform_shape)")
        self.index = index
        self.augment = augment
        self.frames = cache.buffer.view(-1, *shape)
        # bad files take no bytes, so a good image's offset / its size is its frame; bad ones: -1
        good = cache.shapes[:, 0] > 0
        self.frame = torch.where(good, cache.offsets // shape.numel(), -1)

    def __len__(self) -> int:
        return len(self.index)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        frame = self.frame[indices]
        kept = frame >= 0
        if not kept.any():
            return None
        rows = np.asarray(indices)[kept.numpy()]
        return self.augment(self.frames[frame[kept]]), torch.from_numpy(self.index.labels[rows])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int | torch.Tensor] | None:
        batch = self.__getitems__([i])
        if batch is None:
            return None
        label = batch[1][0]
        # room: multilabel begin
        if label.ndim:  # a multi-hot row, as ImageDataset returns it
            return batch[0][0], label
        # room: multilabel end
        return batch[0][0], int(label)  # as ImageDataset returns it


def uniform_shape(cache: DecodedImages) -> torch.Size | None:
    """The one [C, H, W] shape of every decoded image (files that failed aside), or None."""
    shapes = cache.shapes[cache.shapes[:, 0] > 0]
    if not len(shapes) or not bool((shapes == shapes[0]).all()):
        return None
    return torch.Size(shapes[0].tolist())


def whole_batch(batch: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The collate function of `CachedBatches`: its `__getitems__` returns the batch already made."""
    return batch
