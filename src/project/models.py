"""`python -m project models [PATTERN]`: the backbones --model.backbone takes, with their weights.

    python -m project models                  # every model of each family (backbones.FAMILIES)
    python -m project models 'resnet*'        # a shell-style pattern; a plain word matches anywhere
    python -m project models --pretrained mobilenet   # only those with pretrained weights

One line per model: the name to pass, the weights --model.weights takes (DEFAULT first) and the
preprocessing those weights expect (input size, resize interpolation, crop, mean/std).
"""

from __future__ import annotations

import difflib
import fnmatch
import sys
from types import ModuleType

from project.backbones import FAMILIES, family_of
from project.errors import CommandParser, UserError, exits_on_user_error, user_message


def matching(names: list[str], pattern: str | None, prefix: str = "") -> list[str]:
    """`names` that match `pattern` (shell-style; a pattern without wildcards matches anywhere), with or
    without their family's `prefix`."""
    if not pattern:
        return names
    if not any(c in pattern for c in "*?["):
        pattern = f"*{pattern}*"
    pattern = pattern.lower()
    # timm/resnet1? and resnet1? both find timm/resnet18
    return [n for n in names if fnmatch.fnmatchcase(n.lower(), pattern) or _bare_match(n, prefix, pattern)]


def _bare_match(name: str, prefix: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name.lower().removeprefix(prefix), pattern)


def family_rows(family: ModuleType, names: list[str], pattern: str | None, pretrained: bool) -> list[str]:
    """One line per backbone of `family` (of its `names`) that matches `pattern`: its name, weights and their
    preprocessing."""
    rows = []
    for name in matching(names, pattern, family.PREFIX):
        tags = family.weight_names(name)
        if not tags:
            if not pretrained:
                rows.append(f"{name}  weights: none")
            continue
        shown = ", ".join(["DEFAULT", *tags[:4]]) + (f", ... ({len(tags)} tags)" if len(tags) > 4 else "")
        rows.append(f"{name}  weights: {shown}  {_shown(family.preprocessing(name))}")
    return rows


def families() -> dict[ModuleType, list[str]]:
    """Each family of backbones.FAMILIES with its backbone names, torchvision's first; one whose package is
    not installed is left out, with a line on stderr saying how to install it."""
    found = {}
    for prefix in sorted(FAMILIES, key=len):  # torchvision's has no prefix
        family = family_of(prefix)
        try:
            found[family] = family.names()
        except UserError as e:
            print(f"({user_message(e)})", file=sys.stderr)
    return found


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
        description="List the backbones --model.backbone takes, family by family (torchvision's first), "
        "with the weights --model.weights takes and their preprocessing.",
    )
    parser.add_argument("pattern", nargs="?", help="shell-style pattern (resnet*); a word matches anywhere")
    parser.add_argument("--pretrained", action="store_true", help="only models with pretrained weights")
    args = parser.parse_args(argv)
    found = families()
    rows = [
        row
        for family, names in found.items()
        for row in family_rows(family, names, args.pattern, args.pretrained)
    ]
    if not rows:
        raise UserError(f"No backbone matches '{args.pattern}'.", _hint(args.pattern, found))
    print("\n".join(rows))


def _hint(pattern: str, found: dict[ModuleType, list[str]]) -> str:
    names = [name for names in found.values() for name in names]
    close = difflib.get_close_matches(pattern, names, n=3)
    return f"did you mean {', '.join(close)}?" if close else "run `python -m project models` for every name."
