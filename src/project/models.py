"""`python -m project models [PATTERN]`: the backbones --model.backbone takes, with their weights.

    python -m project models                  # every torchvision model, then every timm model
    python -m project models 'timm/convnext*'  # a shell-style pattern; a plain word matches anywhere
    python -m project models --pretrained mobilenet   # only those with pretrained weights

One line per model: the name to pass, the weights --model.weights takes (DEFAULT first) and the
preprocessing those weights expect (input size, resize interpolation, crop, mean/std).
"""

from __future__ import annotations

import difflib
import fnmatch
import sys

from project.errors import CommandParser, UserError, exits_on_user_error, install_hint


def matching(names: list[str], pattern: str | None) -> list[str]:
    """`names` that match `pattern` (shell-style; a pattern without wildcards matches anywhere)."""
    if not pattern:
        return names
    if not any(c in pattern for c in "*?["):
        pattern = f"*{pattern}*"
    pattern = pattern.lower()
    # timm/resnet1? and resnet1? both find timm/resnet18
    return [
        n for n in names if fnmatch.fnmatchcase(n.lower(), pattern) or fnmatch.fnmatchcase(_bare(n), pattern)
    ]


def _bare(name: str) -> str:
    return name.lower().removeprefix("timm/")


def torchvision_rows(pattern: str | None, pretrained: bool) -> list[str]:
    import torchvision

    from project.backbones import TORCHVISION_PREPROCESSING, classification_models

    rows = []
    for name in matching(classification_models(), pattern):
        tags = [t for t in torchvision.models.get_model_weights(name).__members__ if t != "DEFAULT"]
        if pretrained and not tags:
            continue
        rows.append(
            f"{name}  weights: {', '.join(['DEFAULT', *tags]) if tags else 'none'}  "
            + _shown(TORCHVISION_PREPROCESSING)
        )
    return rows


def timm_rows(pattern: str | None, pretrained: bool) -> list[str]:
    from project import timm_backbones

    timm = timm_backbones.timm_module()
    with_weights = {n.split(".", 1)[0] for n in timm.list_models(pretrained=True)}
    rows = []
    for name in matching(timm_backbones.model_names(), pattern):
        arch = name.removeprefix(timm_backbones.PREFIX)
        if arch not in with_weights:
            if not pretrained:
                rows.append(f"{name}  weights: none")
            continue
        tags = timm_backbones.weight_tags(name)
        shown = ", ".join(["DEFAULT", *tags[:4]]) + (f", ... ({len(tags)} tags)" if len(tags) > 4 else "")
        rows.append(f"{name}  weights: {shown}  {_shown(timm_backbones.pretrained_config(name))}")
    return rows


def _shown(config: dict) -> str:
    mean = ",".join(f"{v:g}" for v in config["mean"])
    std = ",".join(f"{v:g}" for v in config["std"])
    return (
        f"({config['input_size']} px, {config['interpolation']}, crop {config['crop_pct']:g}, "
        f"mean {mean}, std {std})"
    )


@exits_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = CommandParser(
        prog="python -m project models",
        description="List the backbones --model.backbone takes (torchvision's, and timm's as timm/<name> "
        "when timm is installed), with the weights --model.weights takes and their preprocessing.",
    )
    parser.add_argument(
        "pattern", nargs="?", help="shell-style pattern (timm/convnext*); a word matches anywhere"
    )
    parser.add_argument("--pretrained", action="store_true", help="only models with pretrained weights")
    args = parser.parse_args(argv)
    rows = torchvision_rows(args.pattern, args.pretrained)
    try:
        rows += timm_rows(args.pattern, args.pretrained)
    except UserError:
        # timm is optional: say so once, after whatever torchvision has
        hint = install_hint("timm", "timm")
        print(f"(timm is not installed: {hint} adds timm/<name> backbones)", file=sys.stderr)
    if not rows:
        raise UserError(f"No backbone matches '{args.pattern}'.", _hint(args.pattern))
    print("\n".join(rows))


def _hint(pattern: str) -> str:
    from project.backbones import classification_models

    names = classification_models()
    try:
        from project import timm_backbones

        names += timm_backbones.model_names()
    except UserError:
        pass
    close = difflib.get_close_matches(pattern, names, n=3)
    return f"did you mean {', '.join(close)}?" if close else "run `python -m project models` for every name."
