r"""Text for the terminal: names (files, class folders, runs) printed with their control characters escaped.

A name is bytes chosen by whoever made the file: `printf '\e]0;owned\a'` as a class folder set the
terminal's title when a message printed it, and a newline in a name forged a line of output. Every
message that can hold a name goes through `printable`, which escapes what repr would (`\x1b`, `\n`,
`\u202e`, the bytes of a name that is not UTF-8) and leaves all printable text, any script, as it is.
A URL's `user:password@` is never printed nor written (config.yaml, the trackers): `without_credentials`.
"""

from __future__ import annotations

import logging
import re

# `scheme://user:password@host`: the part before @ is never written anywhere
_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"]+@")


def without_credentials(text: str) -> str:
    """`text` with the `user:password@` of every URL in it removed (`http://u:p@host` -> `http://host`)."""
    return _CREDENTIALS.sub(r"\g<scheme>", text)


def printable(text: str) -> str:
    """`text` with each non-printable character written as its escape sequence (repr's form)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def printable_lines(text: str) -> str:
    """`printable` per line: for messages of several lines (tables) whose names are escaped."""
    return "\n".join(printable(line) for line in text.split("\n"))


class PrintableLog(logging.Filter):
    """Escapes the control characters of a log record's message and arguments. For loggers that print
    what a client sent, such as uvicorn's access log, whose client address comes from X-Forwarded-For."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = printable(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(printable(a) if isinstance(a, str) else a for a in record.args)
        return True
