"""The one exception type for mistakes a user can fix: printed as a message, never as a traceback."""

import argparse
import difflib
import functools
import re
import sys
from collections.abc import Callable, Iterable
from typing import NoReturn, ParamSpec

from project.terminal import printable

P = ParamSpec("P")

# jsonargparse's names of the types a value failed, as a message says what is expected
TYPE_NAMES = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a text",
    "NoneType": "null",
    "tuple": "a list, such as [1, 2]",
    "list": "a list, such as [1, 2]",
    "dict": "a mapping, such as {a: 1}",
}
# How a DataLoader worker's re-raised exception ends: "...\nproject.errors.UserError: <message>\n"
_WORKER_TAIL = re.compile(r"\n(?:[\w.]+\.)?\w*Error: (?P<message>.*?)\s*\Z", re.DOTALL)


class UserError(Exception):
    """A problem in the user's data or configuration, with what was expected and how to fix it."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        # one-argument form: DataLoader workers re-create the exception from its text
        super().__init__(problem if fix is None else f"{problem} Fix: {fix}")


def install_hint(extra: str | None, packages: str) -> str:
    """How to install a part of the project: the one wording of every "install X" advice.

    Args:
        extra: The extra of pyproject.toml that brings it (`timm`, `trackers`, ...); None for a
            dependency of the core, missing from an environment installed before it was one.
        packages: The packages themselves, for an environment without a clone of the project.
    """
    target = f"'.[{extra}]'" if extra else "."
    return f"pip install -e {target} (or pip install {packages})"


def extra_packages(extra: str) -> str:
    """The packages an extra of this installed package brings, space-separated ("" when not recorded)."""
    from importlib import metadata

    try:
        requirements = metadata.requires(__package__ or "") or []
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return ""
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    return " ".join(re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0] for r in requirements if marker.search(r))


def module_of(package: str) -> str:
    """The module a package is imported as, by the usual rule (`python-multipart` -> `multipart`)."""
    return package.lower().replace("-", "_").removeprefix("python_")


def missing_package(needed_for: str, extra: str, packages: str) -> UserError:
    """The UserError for an optional package that is not installed: what needs it and how to install it."""
    names = packages.split()
    quoted = [f"`{name}`" for name in names]
    what = " and ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
    what += " packages, which are" if len(names) > 1 else " package, which is"
    return UserError(f"{needed_for} needs the {what} not installed.", install_hint(extra, packages) + ".")


def user_message(error: BaseException) -> str:
    """The user-facing text of a UserError, also when a DataLoader worker re-raised it with a traceback.

    One line, ready to print: the names it quotes have their control characters escaped.
    """
    text = str(error)
    if "Original Traceback" not in text:
        return printable(text)
    tail = _WORKER_TAIL.search(text.rsplit("Traceback (most recent call last):", 1)[-1])
    return printable(tail.group("message")) if tail else text


def exits_on_user_error(main: Callable[P, None]) -> Callable[P, None]:
    """The one error path of every command's `main`: a UserError ends the command with one line,
    `error: <problem> Fix: <fix>` on stderr, and exit status 2 (as argparse's own usage errors)."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            main(*args, **kwargs)
        except UserError as e:
            print(f"error: {user_message(e)}", file=sys.stderr)
            sys.exit(2)

    return run


class CommandParser(argparse.ArgumentParser):
    """argparse's parser whose refusals of the command line (a value of the wrong type, a missing or
    unknown argument) are a UserError with a fix, one line, instead of the usage text and `error:`."""

    def error(self, message: str) -> NoReturn:
        raise usage_error(message, self.prog, self._option_string_actions)


def usage_error(message: str, prog: str, options: Iterable[str] = ()) -> UserError:
    """The UserError for what argparse or jsonargparse said of a command line, with a fix.

    Args:
        message: the parser's message (jsonargparse's spans several lines).
        prog: the command (`python -m project infer`), for the pointer to its --help.
        options: its option strings, for a suggestion when one is misspelt.
    """
    see = f"`{prog} --help` says what each option takes"
    text = " ".join(message.split())
    if match := re.match(r"argument (\S+?)(?:/\S+)?: invalid (\w+) value: (.*)", text):
        flag, kind, value = match.groups()
        expected = TYPE_NAMES.get(kind, f"a valid {kind} value")
        return UserError(f"{flag} {value} is not {expected}.", f"give {flag} {expected} ({see}).")
    if match := re.match(r"argument (\S+?)(?:/\S+)?: expected one argument", text):
        return UserError(f"{match[1]} is given without its value.", f"pass {match[1]}=VALUE ({see}).")
    if match := re.match(r"argument (\S+?)(?:/\S+)?: invalid choice: '(.*?)' \(choose from (.*)\)", text):
        flag, value, choices = match.groups()
        close = difflib.get_close_matches(value, re.findall(r"'([^']*)'", choices), n=1)
        fix = f"did you mean '{close[0]}'?" if close else f"pick one of {choices}."
        return UserError(f"{flag} '{value}' is not one of {choices}.", fix)
    if match := re.match(r"the following arguments are required: (.*)", text):
        return UserError(
            f"Missing from the command line: {match[1]} (needed by {prog}).", f"pass {match[1]} ({see})."
        )
    if match := re.match(r"unrecognized arguments: (.*)", text):
        return _unknown_arguments(prog, match[1], options, see)
    if match := re.match(r'Parser key "([^"]+)":', message):
        return _typed_value_error(message, match[1], see)
    return UserError(f"{prog}: {text}.", f"{see}.")


def _unknown_arguments(prog: str, given: str, options: Iterable[str], see: str) -> UserError:
    flags = [arg.partition("=")[0] for arg in given.split() if arg.startswith("-")]
    close = [m[0] for flag in flags if (m := difflib.get_close_matches(flag, list(options), n=1))]
    fix = f"did you mean {', '.join(close)}?" if close else f"leave it out ({see})."
    return UserError(f"{prog} does not take {given}.", fix)


def _typed_value_error(message: str, key: str, see: str) -> UserError:
    """jsonargparse's `Parser key "data.batch_size": Expected a <class 'int'>. Got value: abc` as one line."""
    keys = re.findall(r'Parser key "([^"]+)"', message)
    flag = f"--{keys[0]}.init_args.{keys[-1]}" if len(keys) > 1 and "init_args" in message else f"--{key}"
    if missing := re.search(r"File does not exist: '(.*?)'", message):
        return UserError(f"{flag}: the file '{missing[1]}' does not exist.", "check the path.")
    innermost = message.rsplit("Parser key", 1)[-1]
    found = re.findall(r"Expected a (?:<class '(?:[\w.]+\.)?(\w+)'>|typing\.Literal\[(.*?)\])", innermost)
    literals = ", ".join(literal for _, literal in found if literal)
    kinds = [TYPE_NAMES[kind] for kind, literal in found if not literal and kind in TYPE_NAMES]
    expected = [f"one of {literals}"] * bool(literals) + list(dict.fromkeys(kinds))
    given = re.search(r"(?:Given|Got) value: (.*?)(?:\. Got value: |\n|$)", message)
    value = f"={given[1]}" if given else ""
    if expected:
        return UserError(
            f"{flag}{value} is not {' or '.join(expected)}.", f"correct the value of {flag} ({see})."
        )
    if name := re.search(r"dot import path string: (\S+)", message):  # a class option given a bad name
        return UserError(
            f"{flag}={name[1]} names no class that can be imported.",
            f"give {flag} the full import path of a class, such as torch.optim.SGD ({see}).",
        )
    return UserError(f"{flag}{value} is not valid: {' '.join(message.split()[3:])[:300]}.", f"{see}.")
