"""Commands that need no Lightning start without importing it (nor torch)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "command",
    [
        "infer",
        "report",  # room: report
        "new",  # room: new
    ],
)
def test_torch_free_commands_import_neither_torch_nor_lightning(command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "project", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "usage:" in done.stdout
    modules = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "numpy" in modules or command == "new"  # the import log was read
    assert not {"torch", "lightning"} & modules
