import sys
from pathlib import Path
from urllib.error import URLError

import pytest
import torch
import torchvision
from torch import nn
from torchvision.models.regnet import BlockParams
from torchvision.models.vision_transformer import VisionTransformer, interpolate_embeddings

from project.backbones import (
    FAMILIES,
    build_backbone,
    family_of,
    head_of,
    load_weights,
    logits_and_features,
    preprocessing,
    read_safetensors,
)
from project.errors import UserError

# room: finetune begin
from project.finetune import depth_levels

# room: finetune end
from project.model import ImageClassifier
from project.torchvision_backbones import classification_models, size_arguments
from tests.helpers import RunsCode, write_deflated


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


@pytest.mark.parametrize("prefix", list(FAMILIES))
def test_every_family_keeps_the_contract(prefix: str, tmp_path: Path) -> None:
    """What every command asks of a family (backbones.FAMILIES), on its EXAMPLE model: a head sized for
    the classes, the penultimate features, the weights' preprocessing, weights from a local file (both
    formats) into every tensor but the head, depth levels that hold each parameter once with the head
    last, a spatial feature map for Grad-CAM, and one message for a name or weights it does not have."""
    from safetensors.torch import save_file

    family = family_of(prefix)
    name = family.EXAMPLE
    assert name.startswith(prefix) and family_of(name) is family and name in family.names()
    torch.manual_seed(0)
    net = build_backbone(name, 5, image_size=64).eval()
    head = head_of(net)
    with torch.no_grad():
        logits, features = logits_and_features(net, torch.rand(2, 3, 64, 64))
    assert logits.shape == (2, 5) and head.out_features == 5
    assert features is not None and features.shape == (2, head.in_features)

    config = preprocessing(name)
    assert set(config) == {"mean", "std", "input_size", "interpolation", "crop_pct", "tag"}
    assert len(config["mean"]) == len(config["std"]) == 3
    assert config["interpolation"] in ("bilinear", "bicubic")

    own = net.state_dict()
    head_keys = {f"{path}.{p}" for path, m in net.named_modules() if m is head for p in ("weight", "bias")}
    torch.save(own, tmp_path / "weights.pth")
    save_file({k: v.contiguous() for k, v in own.items()}, tmp_path / "weights.safetensors")
    assert read_safetensors(tmp_path / "weights.safetensors").keys() == own.keys()
    for file in ("weights.pth", "weights.safetensors"):
        loaded = build_backbone(name, 2, weights=str(tmp_path / file), image_size=64).state_dict()
        assert all(torch.equal(loaded[k], own[k]) for k in own if k not in head_keys)
        assert all(loaded[k].shape[0] == 2 for k in head_keys)

    # room: finetune begin
    levels = depth_levels(net, name)
    assert sorted(id(p) for level in levels for p in level) == sorted(id(p) for p in net.parameters())
    assert {id(p) for p in levels[-1]} == {id(p) for p in head.parameters()} and len(levels) > 2
    # room: finetune end

    stage = family.feature_stage(net, name)
    maps: list[torch.Tensor] = []
    stage.register_forward_hook(lambda module, inputs, output: maps.append(output))
    with torch.no_grad():
        net(torch.rand(1, 3, 64, 64))
    assert maps[-1].ndim == 4 and min(maps[-1].shape[-2:]) > 1

    with pytest.raises(UserError, match=rf"Unknown backbone '{prefix}resnet81' \(--model.backbone\)"):
        build_backbone(f"{prefix}resnet81", 2)
    with pytest.raises(UserError, match=rf"Backbone '{name}' has no weights 'NO_SUCH' \(--model.weights\)"):
        build_backbone(name, 2, weights="NO_SUCH")


def test_a_safetensors_file_without_the_package_is_one_error_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An environment installed before safetensors was a dependency of the project."""
    monkeypatch.setitem(sys.modules, "safetensors", None)  # what `import safetensors` does, uninstalled
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"\0" * 16)
    with pytest.raises(UserError) as error:
        build_backbone("resnet18", 3, weights=str(weights))
    assert str(error.value) == (
        f"Weights file '{weights}' is a .safetensors file: reading it needs the safetensors package, which "
        "is not installed. Fix: pip install -e . (or pip install safetensors): the project depends on it."
    )


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


# Backbones that cannot take the default 64 px images, and the size each message suggests.
REFUSED_AT_64 = {"inception_v3": 75, "maxvit_t": 224, "vit_h_14": 70}


@pytest.mark.parametrize("name", classification_models())
def test_every_backbone_takes_64_px_or_names_the_size_it_needs(name: str) -> None:
    """Cheap (nothing is built): the size rule of each torchvision model at the default image size."""
    if name in REFUSED_AT_64:
        with pytest.raises(UserError) as error:
            size_arguments(name, 64)
        message = str(error.value)
        assert message.startswith(f"Backbone '{name}' cannot take 64 px images (--data.image_size=64)")
        assert f"Fix: set --data.image_size={REFUSED_AT_64[name]}" in message and "\n" not in message
    else:
        assert size_arguments(name, 64) == ({"image_size": 64} if name.startswith("vit_") else {})


def smallest_size(name: str) -> int:
    """The smallest image size from 32 px up that `name` takes, by the template's own size rule."""
    for size in range(32, 1025):
        try:
            size_arguments(name, size)
        except UserError:
            continue
        return size
    raise AssertionError(f"{name} takes no size up to 1024 px")


@pytest.mark.parametrize("name", classification_models())
def test_every_backbone_builds_and_runs_at_its_smallest_size(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each torchvision model is built as the template builds it (no weights) and run forward at the
    smallest size its rule allows, giving num_classes logits. On the meta device: every layer checks
    the shapes it gets, but no value is computed and no memory filled (vit_h_14 and regnet_y_128gf
    have 630M+ parameters; all 80 models take about 35 s on 2 cores)."""
    original = BlockParams.from_init_params.__func__

    def widths_on_the_cpu(cls: type, *args: object, **kwargs: object) -> BlockParams:
        with torch.device("cpu"):  # RegNet computes its block widths with tensors, then .tolist()
            return original(cls, *args, **kwargs)

    monkeypatch.setattr(BlockParams, "from_init_params", classmethod(widths_on_the_cpu))
    size = smallest_size(name)
    with torch.device("meta"):
        model = build_backbone(name, num_classes=7, image_size=size).eval()
        logits = model(torch.zeros(2, 3, size, size))
    assert logits.shape == (2, 7)
    head = head_of(model)
    assert (head.out_features if isinstance(head, nn.Linear) else head.out_channels) == 7


@pytest.mark.parametrize(("name", "size"), [("vit_b_32", 64), ("inception_v3", 75), ("maxvit_t", 224)])
def test_fixed_size_families_build_for_the_configured_size(name: str, size: int) -> None:
    model = build_backbone(name, num_classes=3, image_size=size).eval()
    with torch.no_grad():
        assert model(torch.zeros(1, 3, size, size)).shape == (1, 3)


@pytest.mark.parametrize(("name", "size"), [("vit_b_32", 48), ("inception_v3", 64), ("maxvit_t", 64)])
def test_a_size_the_backbone_cannot_take_stops_before_building(name: str, size: int) -> None:
    with pytest.raises(UserError, match=rf"Backbone '{name}' cannot take {size} px images"):
        ImageClassifier(num_classes=3, backbone=name, image_size=size)


def test_vit_weights_of_another_size_get_an_interpolated_position_embedding(tmp_path: Path) -> None:
    def tiny_vit(size: int) -> VisionTransformer:
        return VisionTransformer(size, patch_size=32, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=8)

    torch.manual_seed(0)
    source = tiny_vit(224)  # made at 224 px: 7x7 patches + the class token
    torch.save(source.state_dict(), tmp_path / "vit.pth")
    model = tiny_vit(64)
    load_weights(model, "vit_b_32", str(tmp_path / "vit.pth"))
    expected = interpolate_embeddings(64, 32, source.state_dict())["encoder.pos_embedding"]
    assert model.encoder.pos_embedding.shape == (1, 2 * 2 + 1, 8)
    assert torch.equal(model.encoder.pos_embedding, expected)
    assert torch.equal(model.conv_proj.weight, source.conv_proj.weight)


def test_a_planted_pickle_in_the_torchvision_cache_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file the offline message tells users to copy into place is read weights-only."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    marker = tmp_path / "code-ran"
    url = torchvision.models.get_model_weights("squeezenet1_1").DEFAULT.url
    cache = tmp_path / "torch" / "hub" / "checkpoints" / url.rsplit("/", 1)[1]
    cache.parent.mkdir(parents=True)
    torch.save({"features.0.weight": RunsCode(marker)}, cache)
    with pytest.raises(UserError) as error:
        build_backbone("squeezenet1_1", 3, weights="DEFAULT")
    message = str(error.value)
    assert message.startswith(f"Refused to load the cached weights '{cache}' (squeezenet1_1 DEFAULT)")
    assert "(posix.system)" in message and "Nothing in it was executed" in message and "\n" not in message
    assert not marker.exists()


@pytest.mark.parametrize("source", ["cache", "download", "file"])
def test_torchvision_weights_declaring_more_than_they_hold_are_refused_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """torchvision's cache, a fresh download and a --model.weights file all get the declared-size check."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    entry = torchvision.models.get_model_weights("squeezenet1_1").DEFAULT
    cache = tmp_path / "torch" / "hub" / "checkpoints" / entry.url.rsplit("/", 1)[1]
    bomb = cache if source != "file" else tmp_path / "weights.pth"
    state = {"features.0.weight": torch.zeros(2_500_000)}  # 10 MB declared, deflated to about 10 kB
    if source == "download":  # the download writes the file, as torch.hub's does
        monkeypatch.setattr(
            torch.hub, "download_url_to_file", lambda url, dst, **_: write_deflated(state, Path(dst))
        )
    else:
        bomb.parent.mkdir(parents=True, exist_ok=True)
        write_deflated(state, bomb)
    with pytest.raises(UserError) as error:
        build_backbone("squeezenet1_1", 3, weights=str(bomb) if source == "file" else "DEFAULT")
    message = str(error.value)
    named = (
        f"checkpoint '{bomb}'" if source == "file" else f"the cached weights '{bomb}' (squeezenet1_1 DEFAULT)"
    )
    assert message.startswith(f"Refused to load {named}: its entries declare 10,00"), message
    assert f"more than the file's {bomb.stat().st_size:,} bytes" in message


@pytest.mark.slow
def test_the_image_size_is_the_weights_own_unless_given(shapes_root: Path, tmp_path: Path) -> None:
    """From scratch: the embedded shapes' 64 px; with weights: their input size (torchvision's 224)."""
    from tests.helpers import built_as_fit, fast_args

    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    args = [arg for arg in fast_args(shapes_root) if not arg.startswith("--data.image_size")]
    sizes = {}
    for case, extra in {
        "scratch": [],
        "weights": [f"--model.weights={weights}"],
        "given": [f"--model.weights={weights}", "--data.image_size=96"],
    }.items():
        cli = built_as_fit(*args, "--data.batch_size=2", *extra)
        assert cli.model.hparams.image_size == cli.datamodule.image_size
        sizes[case] = cli.datamodule.image_size
    assert sizes == {"scratch": 64, "weights": 224, "given": 96}
