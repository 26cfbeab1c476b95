"""Names reach the terminal escaped: a file or class name cannot send control sequences or forge lines."""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import pytest

from project.errors import UserError, user_message
from project.terminal import PrintableLog, printable, printable_lines
from tests.helpers import fast_args, run_cli

TITLE = "\x1b]0;owned\x07"  # sets the terminal's title
EVIL = f"cat{TITLE}\nerror: forged"


def test_control_characters_are_escaped_and_other_text_kept() -> None:
    assert printable(EVIL) == "cat\\x1b]0;owned\\x07\\nerror: forged"
    assert printable("\u202eevil\t\udce9") == "\\u202eevil\\t\\udce9"  # bidi override, tab, a non-UTF-8 byte
    assert printable("café 日本 'quoted' \\ plain") == "café 日本 'quoted' \\ plain"
    assert printable_lines(f"a\n{TITLE}\nb") == "a\n\\x1b]0;owned\\x07\nb"


def test_error_messages_are_one_line_whatever_the_names() -> None:
    message = user_message(UserError(f"Cannot decode image '{EVIL}.jpg': empty.", "replace it."))
    assert (
        message == "Cannot decode image 'cat\\x1b]0;owned\\x07\\nerror: forged.jpg': empty. Fix: replace it."
    )


@pytest.mark.slow
def test_a_class_folder_with_control_characters_is_printed_escaped(
    workdir: Path, shapes_root: Path, capfd: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    data = workdir / "data"
    for split in ("train", "val"):
        for name, source in ((EVIL, "circle"), ("plain", "square")):
            shutil.copytree(shapes_root / split / source, data / split / name)
    caplog.set_level(logging.INFO)  # the data check's class count table
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        assert run_cli("fit", *fast_args(data, "--name=odd")) == 0
    printed = "".join(capfd.readouterr()) + caplog.text + "".join(str(w.message) for w in warned)
    assert "\x1b" not in printed and "\x07" not in printed  # neither in messages nor in warnings
    assert "cat\\x1b]0;owned\\x07\\nerror: forged" in printed  # the class count table names it, escaped
    assert "\nerror: forged" not in printed


def test_a_log_record_is_printed_with_its_control_characters_escaped() -> None:
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, "", 0, '%s - "%s %s"', ("\x9b31m:0", "GET", "/"), None
    )
    assert PrintableLog().filter(record)
    assert record.getMessage() == '\\x9b31m:0 - "GET /"'
