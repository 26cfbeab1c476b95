"""Read every image of the audit once: bytes hash, perceptual hash, colour thumbnail, small decoded copy.

The copy (short side `side` pixels, what the evaluation transform resizes to anyway) is kept as a
DecodedImages buffer, so every fold trains from memory and the files are read exactly once, read only.
A file the project's decoder refuses is listed with its reason and left out of everything else.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from project.audit.stop import raise_if_stopped
from project.data.decode import BadImageError, decode_rgb, read_file
from project.data.decoded import DecodedImages
from project.data.index import ImageIndex

HASH_SIDE = 32  # pHash: grayscale 32x32, the 8x8 lowest DCT frequencies
HASH_KEEP = 8
THUMB_SIDE = 8  # the colour thumbnail: 8x8 RGB, compared by mean absolute difference
CHUNK = 64


def dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix: a 2-D DCT is D @ X @ D.T (imagehash would add PyWavelets for this)."""
    k = np.arange(n)[:, None]
    d = np.cos(np.pi * (2 * np.arange(n)[None, :] + 1) * k / (2 * n)) * np.sqrt(2 / n)
    d[0] /= np.sqrt(2)
    return d


_DCT = dct_matrix(HASH_SIDE)


def phash(rgb: np.ndarray) -> np.ndarray:
    """64 bits (bool) of the perceptual hash of an HWC uint8 image: low DCT frequencies above their median.

    Resizing, recompression and small crops move few of these bits; different pictures differ in ~half.
    """
    gray = Image.fromarray(rgb).convert("L").resize((HASH_SIDE, HASH_SIDE), Image.Resampling.BOX)
    freq = _DCT @ np.asarray(gray, dtype=np.float64) @ _DCT.T
    low = freq[:HASH_KEEP, :HASH_KEEP].reshape(-1)
    return low > np.median(low[1:])  # the DC term is left out of the median: it is the mean brightness


@dataclass(frozen=True)
class AuditImages:
    """Every file of the index: decoded copies (bad files: shape 0), sha256 of the bytes, pHash bits."""

    decoded: DecodedImages
    digests: list[str]  # "" for a bad file
    hashes: np.ndarray  # bool [N, 64]
    thumbs: np.ndarray  # float32 [N, 8 * 8 * 3]: the colours pHash (grayscale) does not see
    bad: dict[int, str]  # position in the index -> why the file was refused

    @property
    def good(self) -> np.ndarray:
        return np.array([i for i in range(len(self.digests)) if i not in self.bad], dtype=np.int64)


class _Read(Dataset):
    """Image i read and decoded once (by the project's decoder, as in fit), or the reason it is bad."""

    def __init__(self, index: ImageIndex, side: int) -> None:
        self.index = index
        self.resize = v2.Resize(side, antialias=True)
        self.side = side

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor | None, str, np.ndarray, np.ndarray, str]:
        path = self.index.path(i)
        try:
            data = read_file(path)  # the one read of this file
            rgb = decode_rgb(data, path)  # the decoding rule of every command (Pillow's pixels)
        except BadImageError as e:
            return None, "", np.zeros(HASH_KEEP**2, dtype=bool), np.zeros(THUMB_SIDE**2 * 3), e.reason
        digest = hashlib.sha256(data).hexdigest()
        bits = phash(rgb)
        thumb = Image.fromarray(rgb).resize((THUMB_SIDE, THUMB_SIDE), Image.Resampling.BOX)
        image = torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1)))
        if min(image.shape[1:]) > self.side:
            image = self.resize(image)
        return image.contiguous(), digest, bits, np.asarray(thumb, dtype=np.float32).reshape(-1), ""


def read_images(index: ImageIndex, side: int, num_workers: int) -> AuditImages:
    """Decode every file of `index` once, in `num_workers` loader processes."""
    loader = DataLoader(_Read(index, side), batch_size=CHUNK, num_workers=num_workers, collate_fn=list)
    images: list[torch.Tensor] = []
    shapes, digests, hashes, thumbs, bad = [], [], [], [], {}
    position = 0
    for chunk in loader:
        raise_if_stopped()
        for image, digest, bits, thumb, reason in chunk:
            if image is None:
                bad[position] = reason
                shapes.append((0, 0, 0))
            else:
                images.append(image.reshape(-1))
                shapes.append(tuple(image.shape))
            digests.append(digest)
            hashes.append(bits)
            thumbs.append(thumb)
            position += 1
    all_shapes = torch.tensor(shapes, dtype=torch.int32).reshape(-1, 3)
    sizes = all_shapes.to(torch.int64).prod(dim=1)
    buffer = torch.cat(images) if images else torch.empty(0, dtype=torch.uint8)
    decoded = DecodedImages(buffer, torch.cumsum(sizes, 0) - sizes, all_shapes)
    hash_bits = np.array(hashes, dtype=bool).reshape(-1, HASH_KEEP**2)
    colours = np.array(thumbs, dtype=np.float32).reshape(-1, THUMB_SIDE**2 * 3)
    return AuditImages(decoded, digests, hash_bits, colours, bad)
