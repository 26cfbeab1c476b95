"""The one exception type for mistakes a user can fix: printed as a message, never as a traceback."""

import re

from project.terminal import printable

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
