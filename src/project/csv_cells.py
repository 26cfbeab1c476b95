"""CSV cells that are text, never formulas: the rule of every CSV the project writes and reads.

A cell that a spreadsheet would evaluate (it starts with = + - @, a tab or a carriage return, as OWASP's
"CSV injection" page lists) is written with a leading `'` (`spreadsheet_cell`). So that every name stays
exact, a cell of `'`s before such a character gets one more `'` too; a reader removes one leading `'`
where `'`s precede such a character (`original_cell`). The predictions CSV (`deploy/prediction_csv.py`)
and the audit's CSVs are written this way.
The labels CSV of `--data.labels_csv` is read this way.  # room: multilabel
"""

from __future__ import annotations

import re

# a spreadsheet evaluates a cell that starts with one of these (after any `'`s of ours: see above)
_FORMULA = re.compile(r"'*[=+\-@\t\r]")


def spreadsheet_cell(text: str) -> str:
    """`text` as a CSV cell that no spreadsheet evaluates: `'` first where it would start a formula.

    Cells that already start with `'`s before such a character get one more, so `original_cell`
    gives back every text exactly (`=1+2.png` -> `'=1+2.png`, `'=x` -> `''=x`, `'a` stays).
    """
    return f"'{text}" if _FORMULA.match(text) else text


def original_cell(cell: str) -> str:
    """The text that `spreadsheet_cell` wrote as `cell`."""
    return cell[1:] if cell.startswith("'") and _FORMULA.match(cell) else cell
