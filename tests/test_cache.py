import shutil
from pathlib import Path

import pytest
import torch

from project.data.batch_augment import CachedBatches
from project.data.cache import auto_cache, decode_all
from project.data.datamodule import ImageDataModule
from project.data.folders import scan_folder
from project.errors import UserError
from tests.helpers import fast_args, run_cli, write_image


def samples(dm: ImageDataModule, split: str, seed: int) -> list[tuple[torch.Tensor, int]]:
    torch.manual_seed(seed)
    dataset = dm.datasets[split]
    return [dataset[i] for i in range(len(dataset))]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cached_samples_equal_uncached_ones(shapes_root: Path, num_workers: int) -> None:
    options = dict(
        root=str(shapes_root), image_size=24, auto_augment="trivialaugment", num_workers=num_workers
    )
    # per-image transforms on cached images (batched augmentation: tests/test_batch_augment.py)
    plain = ImageDataModule(**options, cache=False)
    cached = ImageDataModule(**options, cache=True, batch_augment=False)
    plain.setup("fit")
    cached.setup("fit")
    assert len(cached.decoded["train"]) == 48 and len(cached.decoded["val"]) == 24
    for split in ("train", "val"):  # same seed: the same crops, flips, augmentations and labels
        for (a, label_a), (b, label_b) in zip(
            samples(plain, split, 3), samples(cached, split, 3), strict=True
        ):
            assert torch.equal(a, b) and label_a == label_b
    # and the random augmentation still differs from epoch to epoch
    assert not torch.equal(samples(cached, "train", 3)[0][0], samples(cached, "train", 4)[0][0])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_decoding_the_cache_draws_nothing_from_the_global_random_stream(
    shapes_root: Path, num_workers: int
) -> None:
    """The model's initialization and the first shuffle come after setup, from the global stream."""
    states = []
    for cache in (False, True):
        torch.manual_seed(0)
        ImageDataModule(root=str(shapes_root), image_size=24, num_workers=num_workers, cache=cache).setup(
            "fit"
        )
        states.append(torch.get_rng_state())
    assert torch.equal(states[0], states[1])


@pytest.mark.slow
def test_a_cached_fit_is_the_uncached_fit_of_the_same_seed(shapes_root: Path, workdir: Path) -> None:
    """With the per-image transforms (`--data.batch_augment=false`), caching changes nothing but the time."""
    for name, flags in (("plain", ["--data.cache=false"]), ("cached", ["--data.cache=true"])):
        args = fast_args(shapes_root, f"--name={name}", "--trainer.max_epochs=2", *flags)
        assert run_cli("fit", *args, "--data.batch_augment=false", "--seed_everything=7") == 0
    plain, cached = (
        torch.load(workdir / "checkpoints" / name / "last.ckpt", weights_only=True)["state_dict"]
        for name in ("plain", "cached")
    )
    torch.testing.assert_close(cached, plain, rtol=0, atol=0)


def test_cache_is_decoded_once_and_read_as_views(shapes_root: Path) -> None:
    dm = ImageDataModule(root=str(shapes_root), image_size=24, num_workers=0, cache=True)
    dm.setup("fit")
    decoded = dm.decoded["train"]
    dm.setup("validate")  # a later stage in the same process reuses it
    assert dm.decoded["train"] is decoded
    image = decoded.image(5)
    assert image.shape == (3, 32, 32)
    assert image.untyped_storage().data_ptr() == decoded.buffer.untyped_storage().data_ptr()
    assert decoded.nbytes == 48 * 3 * 32 * 32 + 48 * 8 + 48 * 3 * 4  # pixels, offsets, shapes: no objects


def test_images_of_different_sizes(tmp_path: Path) -> None:
    for i, size in enumerate([(20, 12), (7, 31), (64, 64)]):
        write_image(tmp_path / "a" / f"{i}.png", size=size)
    index = scan_folder(tmp_path)
    decoded = decode_all(index, "train", num_workers=0, skip_bad_images=False)
    assert [tuple(decoded.image(i).shape) for i in range(3)] == [(3, 12, 20), (3, 31, 7), (3, 64, 64)]


def test_bad_file_stops_or_is_skipped(shapes_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    shutil.copytree(shapes_root, root)
    bad = root / "train" / "circle" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff" + b"not a jpeg" * 10)
    strict = ImageDataModule(root=str(root), num_workers=0, cache=True)
    with pytest.raises(UserError, match=r"Cannot decode image '.*broken.jpg'.*skip_bad_images"):
        strict.setup("fit")
    lenient = ImageDataModule(root=str(root), num_workers=0, cache=True, skip_bad_images=True, batch_size=100)
    lenient.setup("fit")
    position = [i for i in range(len(lenient.splits["train"])) if lenient.splits["train"].path(i) == bad]
    assert lenient.decoded["train"].image(position[0]) is None
    images, _ = next(iter(lenient.train_dataloader()))
    assert len(images) == 48  # 49 files, the broken one left out
    train = lenient.datasets["train"]  # augmented a batch at a time: the bad file is left out there
    assert isinstance(train, CachedBatches)
    assert train.__getitems__(position) is None and len(train.__getitems__([*position, 0])[0]) == 1


def test_cache_that_would_not_fit_is_refused_with_the_numbers(shapes_root: Path) -> None:
    index = scan_folder(shapes_root / "train")
    with pytest.raises(
        UserError, match=r"--data.cache=true would hold the 48 train images.*GiB.*--data.cache=false"
    ):
        decode_all(index, "train", num_workers=0, skip_bad_images=False, available=100_000)


def test_auto_caches_small_images_that_fit_and_says_how_to_turn_it_off(shapes_root: Path, capsys) -> None:
    dm = ImageDataModule(root=str(shapes_root), image_size=24, num_workers=0)  # cache=auto: the default
    dm.setup("fit")
    assert len(dm.decoded["train"]) == 48 and len(dm.decoded["val"]) == 24
    notice = [line for line in capsys.readouterr().out.splitlines() if "--data.cache=auto" in line]
    assert len(notice) == 1
    assert "about 0.2 MiB of images of ~32x32 px" in notice[0] and "--data.cache=false" in notice[0]
    dm.setup("validate")  # the later stage reads the same buffer
    assert dm.datasets["val"].cache is dm.decoded["val"]


def test_auto_stays_off_when_told_so_and_outside_fit(shapes_root: Path, capsys) -> None:
    off = ImageDataModule(root=str(shapes_root), num_workers=0, cache=False)
    off.setup("fit")
    evaluate = ImageDataModule(root=str(shapes_root), num_workers=0)  # auto: one pass is no gain
    evaluate.setup("validate")
    with pytest.warns(UserWarning, match="no test/ folder"):
        evaluate.setup("test")
    assert off.decoded == {} and evaluate.decoded == {}
    assert "--data.cache" not in capsys.readouterr().out


def test_auto_rule_memory_share_processes_and_image_size(shapes_root: Path, tmp_path: Path) -> None:
    splits = [scan_folder(shapes_root / "train"), scan_folder(shapes_root / "val")]
    decoded = 72 * 3 * 32 * 32  # train + val, RGB
    assert auto_cache(splits, available=4 * decoded).enabled  # a quarter of the memory: fits
    assert not auto_cache(splits, available=4 * decoded - 1).enabled
    decision = auto_cache(splits, processes=2, available=4 * decoded)  # two copies on this machine
    assert not decision.enabled and decision.decoded_bytes == decoded and decision.mean_pixels == 32 * 32
    assert auto_cache(splits, processes=2, available=8 * decoded).enabled
    for i in range(2):  # large images: not cached, however much memory there is
        write_image(tmp_path / "big" / "a" / f"{i}.png", size=(700, 500))
        write_image(tmp_path / "big" / "b" / f"{i}.png", size=(520, 600))
    big = scan_folder(tmp_path / "big")
    assert auto_cache([big], available=2**40).mean_pixels == (700 * 500 + 520 * 600) / 2
    assert not auto_cache([big], available=2**40).enabled
    write_image(tmp_path / "edge" / "a" / "0.png", size=(512, 512))  # the limit itself is cached
    assert auto_cache([scan_folder(tmp_path / "edge")], available=2**40).enabled
    write_image(tmp_path / "photos" / "a" / "0.png", size=(300, 300))  # ELPV's photos: cached
    assert auto_cache([scan_folder(tmp_path / "photos")], available=2**40).enabled


def test_cache_option_refuses_other_values(shapes_root: Path) -> None:
    with pytest.raises(UserError, match=r"data.cache.*true, false or auto"):
        ImageDataModule(root=str(shapes_root), cache="yes")


class _MeanColour(torch.nn.Module):
    """uint8 images -> their mean colour: a model whose outputs show which pixels it saw."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.float().mean(dim=(2, 3))


def test_export_calibration_reads_the_cached_validation_images_in_this_process(shapes_root: Path) -> None:
    from project.export.validation import collect_logits, validation_loader

    cached = ImageDataModule(root=str(shapes_root), num_workers=2, cache=True)
    plain = ImageDataModule(root=str(shapes_root), num_workers=0, cache=False)
    cached.setup("fit")
    plain.setup("fit")
    loader = validation_loader(cached, 24, 0.875)
    assert loader.num_workers == 0 and loader.dataset.dataset.cache is cached.decoded["val"]
    logits, labels = collect_logits(_MeanColour(), loader)
    expected_logits, expected_labels = collect_logits(_MeanColour(), validation_loader(plain, 24, 0.875))
    assert torch.equal(logits, expected_logits) and torch.equal(labels, expected_labels)
