"""notebooks/: committed without outputs, and each runs top to bottom in a real Jupyter kernel (nbclient).

Each notebook runs in an empty folder of its own (its data, logs/ and checkpoints/ go there), on the CPU,
with the tiny settings it carries, in about a minute.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# the pictures each notebook shows inline: show_batch, report (the quickstart also shows an image it predicts)
PICTURES = {"quickstart": 3, "your_images": 2}


def test_the_notebooks_are_there() -> None:
    assert [p.stem for p in NOTEBOOKS] == sorted(PICTURES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_is_committed_without_outputs(path: Path) -> None:
    """Outputs are large (pictures), change at every run and would show another machine's paths."""
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: {cell.source[:60]!r}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_runs_top_to_bottom_in_a_kernel(path: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # a cell that raises fails here, naming the cell and its traceback
    shown = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    assert len(shown) == PICTURES[path.stem]
    assert (tmp_path / "checkpoints").is_dir() and list(tmp_path.glob("checkpoints/*/latest.onnx"))
