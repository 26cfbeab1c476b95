from pathlib import Path
from urllib.error import URLError

import pytest
import torch
import torchvision
from torch import nn

from project.backbones import build_backbone, head_of
from project.errors import UserError


@pytest.mark.parametrize(
    "name",
    ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "regnet_x_400mf", "squeezenet1_1"],
)
def test_head_has_num_classes_for_every_family(name: str) -> None:
    model = build_backbone(name, num_classes=7).eval()
    with torch.no_grad():
        assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 7)
    head = head_of(model)
    assert (head.out_features if isinstance(head, nn.Linear) else head.out_channels) == 7


def test_vit_head() -> None:
    model = build_backbone("vit_b_16", num_classes=3)
    assert head_of(model).out_features == 3


def test_unknown_backbone_suggests_names() -> None:
    with pytest.raises(UserError, match=r"Unknown backbone 'resnet81'.*did you mean resnet18"):
        build_backbone("resnet81", 2)


def test_weights_from_a_local_file_are_loaded(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = torchvision.models.resnet18(num_classes=1000)  # an ImageNet-shaped state dict
    torch.save(source.state_dict(), tmp_path / "resnet18.pth")
    model = build_backbone("resnet18", num_classes=4, weights=str(tmp_path / "resnet18.pth"))
    assert torch.equal(model.conv1.weight, source.conv1.weight)
    assert torch.equal(model.layer4[1].bn2.running_var, source.layer4[1].bn2.running_var)
    assert model.fc.out_features == 4  # the 1000-class head is not copied


def test_weights_of_another_architecture_are_refused(tmp_path: Path) -> None:
    torch.save(torchvision.models.resnet34().state_dict(), tmp_path / "r34.pth")
    with pytest.raises(UserError, match=r"Weights '.*r34.pth' do not fit backbone 'resnet18'"):
        build_backbone("resnet18", 4, weights=str(tmp_path / "r34.pth"))


def test_missing_weights_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"Weights file '.*nope.pth' \(--model.weights\) does not exist"):
        build_backbone("resnet18", 4, weights=str(tmp_path / "nope.pth"))


def test_unknown_weights_name_lists_the_known_ones() -> None:
    with pytest.raises(UserError, match=r"no weights 'IMAGENET9K'.*DEFAULT, IMAGENET1K_V1"):
        build_backbone("resnet18", 4, weights="IMAGENET9K")


def test_offline_download_says_how_to_pass_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise URLError("no network")

    monkeypatch.setattr(
        torchvision.models.ResNet18_Weights.IMAGENET1K_V1.__class__, "get_state_dict", offline
    )
    with pytest.raises(
        UserError, match=r"Cannot download weights resnet18 DEFAULT.*--model.weights=.*resnet18-"
    ):
        build_backbone("resnet18", 4, weights="DEFAULT")
