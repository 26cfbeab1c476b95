"""The template's own warnings are one line each, and Lightning's messages that help no one are dropped."""

from __future__ import annotations

import warnings
from pathlib import Path

import project
from project.quiet import quiet_lightning

# room: console begin
NOISE = [
    "The number of training batches (3) is smaller than the logging interval Trainer(log_every_n_steps=50). "
    "Set a lower value for log_every_n_steps if you want to see logs for the training epoch.",
    "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided "
    "during `Trainer` instantiation. Please add the following callbacks: ['Timer'].",
]


def test_lightnings_noise_is_dropped_and_other_warnings_still_show() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_lightning()
        for message in NOISE:
            warnings.warn(message, UserWarning, stacklevel=1)
        warnings.warn(
            "Please add the following callbacks: ['Timer', 'MyCallback'].", UserWarning, stacklevel=1
        )
    assert [str(w.message) for w in caught] == [
        "Please add the following callbacks: ['Timer', 'MyCallback']."
    ]


# room: console end
def test_the_templates_own_warnings_print_as_one_line_without_the_source_line() -> None:
    quiet_lightning()
    ours = str(Path(project.__file__).parent / "callbacks" / "data_check.py")
    text = warnings.formatwarning(
        "The validation split has only 30 images.", UserWarning, ours, 99, "rank_zero_warn("
    )
    assert text == "warning: The validation split has only 30 images.\n"
    theirs = warnings.formatwarning("something", UserWarning, "/elsewhere/lib.py", 7, "warn(")
    assert "/elsewhere/lib.py:7: UserWarning: something" in theirs
