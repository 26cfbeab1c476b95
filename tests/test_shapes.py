from pathlib import Path

import numpy as np
from PIL import Image

from project.data.shapes import CLASSES, generate_shapes


def test_generation_is_deterministic_and_atomic(tmp_path: Path) -> None:
    a = generate_shapes(tmp_path / "a", 3, 2, image_size=24, seed=7)
    b = generate_shapes(tmp_path / "b", 3, 2, image_size=24, seed=7)
    files = sorted(p.relative_to(a) for p in a.rglob("*.jpg"))
    assert len(files) == len(CLASSES) * 5
    assert files == sorted(p.relative_to(b) for p in b.rglob("*.jpg"))
    for rel in files:
        assert np.array_equal(np.asarray(Image.open(a / rel)), np.asarray(Image.open(b / rel)))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left over


def test_existing_folder_is_kept(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    generate_shapes(tmp_path / "mine", 1, 1)
    assert list((tmp_path / "mine").iterdir()) == []
