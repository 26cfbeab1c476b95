"""Class imbalance: --data.balance=sampler|loss, the data check's warning, and val/balanced_acc."""

import shutil
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler
from torch.utils.data import WeightedRandomSampler

from project.callbacks.data_check import DataCheck
from project.checkpoint_io import load_checkpoint_file
from project.data.datamodule import ImageDataModule
from project.errors import UserError
from project.model import ImageClassifier
from tests.helpers import fast_args, run_cli


@pytest.fixture
def imbalanced_root(tmp_path: Path, shapes_root: Path) -> Path:
    """The shapes with 1 training star instead of 8 (41 training images)."""
    root = tmp_path / "imbalanced"
    shutil.copytree(shapes_root, root)
    for extra in sorted((root / "train" / "star").iterdir())[1:]:
        extra.unlink()
    return root


def test_sampler_draws_every_class_equally_often(imbalanced_root: Path) -> None:
    torch.manual_seed(0)
    data = ImageDataModule(root=str(imbalanced_root), batch_size=8, num_workers=0, balance="sampler")
    data.setup("fit")
    loader = data.train_dataloader()
    assert isinstance(loader.sampler, WeightedRandomSampler) and len(loader.sampler) == 41
    labels = data.splits["train"].labels
    drawn = Counter(labels[i] for _ in range(100) for i in loader.sampler)  # 4,100 draws
    assert set(drawn) == set(range(6))
    assert all(abs(n / 4100 - 1 / 6) < 0.03 for n in drawn.values()), drawn  # star: 1/41 without


def test_under_ddp_each_process_draws_its_share(imbalanced_root: Path) -> None:
    """Lightning replaces a custom sampler with DistributedSamplerWrapper: half an epoch per process."""
    data = ImageDataModule(root=str(imbalanced_root), batch_size=8, num_workers=0, balance="sampler")
    data.setup("fit")
    loader = data.train_dataloader()
    shares = [
        list(_get_distributed_sampler(loader, shuffle=True, overfit_batches=0, num_replicas=2, rank=r))
        for r in (0, 1)
    ]
    assert [len(s) for s in shares] == [21, 21] and all(0 <= i < 41 for s in shares for i in s)


def test_loss_weights_are_inverse_class_frequency(imbalanced_root: Path) -> None:
    data = ImageDataModule(root=str(imbalanced_root), balance="loss")
    assert data.class_weights == pytest.approx([41 / 48] * 4 + [41 / 6] + [41 / 48])  # star is label 4
    assert ImageDataModule(root=str(imbalanced_root)).class_weights is None


def test_class_weights_weigh_the_training_loss_only() -> None:
    torch.manual_seed(0)
    weights = [1.0, 2.0, 5.0]
    model = ImageClassifier(num_classes=3, backbone="resnet18", class_weights=weights).eval()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 2])
    loss, logits = model.loss((images, labels), weight=model.class_weight)
    assert torch.allclose(loss, F.cross_entropy(logits, labels, weight=torch.tensor(weights)))
    plain, _ = model.loss((images, labels))  # what validation and test report
    assert torch.allclose(plain, F.cross_entropy(logits, labels))
    assert "class_weight" not in model.state_dict()  # a hyper-parameter, not a tensor of the checkpoint


def test_wrong_class_weights_are_refused() -> None:
    with pytest.raises(UserError, match=r"class_weights=\[1.0, 2.0\] .* a list of 3 positive numbers"):
        ImageClassifier(num_classes=3, backbone="resnet18", class_weights=[1.0, 2.0])


def test_imbalance_over_3x_is_warned_with_the_fix() -> None:
    check = DataCheck()
    with pytest.warns(UserWarning, match=r"'cat' has 10 images, 'dog' 3 \(3x\).*--data.balance=sampler"):
        check._warn_imbalance("train", {"cat": 10, "dog": 3}, "none")
    with pytest.warns(UserWarning, match=r"val split is imbalanced.*--checkpoint.monitor=val/balanced_acc"):
        check._warn_imbalance("val", {"cat": 10, "dog": 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check._warn_imbalance("train", {"cat": 9, "dog": 3}, "none")  # 3x: not over
        check._warn_imbalance("train", {"cat": 10, "dog": 3}, "loss")  # balanced already: info only


@pytest.mark.slow
def test_balanced_fit_selects_on_balanced_accuracy_and_its_checkpoint_validates(
    workdir: Path, imbalanced_root: Path
) -> None:
    options = [
        "--data.balance=loss",
        "--data.mixup_alpha=0.2",
        "--checkpoint.monitor=val/balanced_acc",
        "--trainer.limit_train_batches=1",
        "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--model.backbone=mobilenet_v3_small",
    ]
    assert run_cli("fit", *fast_args(imbalanced_root, "--name=b", *options)) == 0
    (best,) = (workdir / "checkpoints" / "b").glob("epoch=000-val_balanced_acc=*.ckpt")
    checkpoint = load_checkpoint_file(best)
    assert checkpoint["hyper_parameters"]["class_weights"] == pytest.approx([41 / 48] * 4 + [41 / 6, 41 / 48])
    # validate takes the weights (and every data option) from the checkpoint, as any other setting
    quick = ["--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"]
    assert run_cli("validate", f"--ckpt_path={best}", *quick) == 0
