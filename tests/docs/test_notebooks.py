"""The notebooks in docs/notebooks run as written, top to bottom, in a fresh kernel, and draw their pictures."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "docs" / "notebooks").glob("*.ipynb"))


def test_there_are_the_two_notebooks_the_readme_links() -> None:
    assert [path.name for path in NOTEBOOKS] == ["functional-batches.ipynb", "train-plot-export.ipynb"]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for path in NOTEBOOKS:
        assert f"docs/notebooks/{path.name}" in readme


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_the_notebook_runs_as_written_and_shows_its_pictures(path: Path, tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "stored with outputs"
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    pictures = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.get("output_type") == "display_data" and "image/png" in output.get("data", {})
    ]
    assert pictures, "the notebook shows no picture"
