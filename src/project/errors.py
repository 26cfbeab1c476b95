"""The one exception type for mistakes a user can fix: printed as a message, never as a traceback."""

import functools
import re
import sys
from collections.abc import Callable
from typing import ParamSpec

from project.terminal import printable

P = ParamSpec("P")

# How a DataLoader worker's re-raised exception ends: "...\nproject.errors.UserError: <message>\n"
_WORKER_TAIL = re.compile(r"\n(?:[\w.]+\.)?\w*Error: (?P<message>.*?)\s*\Z", re.DOTALL)


class UserError(Exception):
    """A problem in the user's data or configuration, with what was expected and how to fix it."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        # one-argument form: DataLoader workers re-create the exception from its text
        super().__init__(problem if fix is None else f"{problem} Fix: {fix}")


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
