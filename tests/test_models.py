"""`models`: the backbones --model.backbone takes, found by pattern, with their weights and preprocessing."""

from __future__ import annotations

import pytest

from project.models import main as models_main


def test_models_lists_the_names_a_pattern_matches_with_weights_and_preprocessing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    models_main(["resnet1?"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.split()[0] == "resnet18"
    assert "weights: DEFAULT, IMAGENET1K_V1  (224 px, bilinear, crop 0.875" in first


def test_models_with_pretrained_lists_only_names_with_weights(capsys: pytest.CaptureFixture[str]) -> None:
    models_main(["--pretrained", "squeezenet"])
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["squeezenet1_0", "squeezenet1_1"]


def test_models_without_a_match_is_one_error_with_the_close_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        models_main(["resnt18"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: No backbone matches 'resnt18'. Fix: did you mean resnet18")
