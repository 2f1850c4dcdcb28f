"""The notebooks in docs/notebooks run as written, top to bottom, in a fresh interpreter, and draw their pictures.

Their code cells run in order in one new process, as a kernel would run them (matplotlib's Agg backend, each
``plt.show()`` counted): a cell that fails fails the test with its traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "docs" / "notebooks").glob("*.ipynb"))

_PRELUDE = """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
_shown = []
def _show(*args, **kwargs):
    _shown.extend(plt.get_fignums())
    plt.close("all")
plt.show = _show
"""

_CODA = """
print("figures shown:", len(_shown))
"""


def test_there_are_the_two_notebooks_the_readme_links() -> None:
    assert [path.name for path in NOTEBOOKS] == ["functional-batches.ipynb", "train-plot-export.ipynb"]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for path in NOTEBOOKS:
        assert f"docs/notebooks/{path.name}" in readme


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_the_notebook_runs_as_written_and_shows_its_pictures(path: Path, tmp_path: Path) -> None:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    assert notebook["nbformat"] == 4
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert code and all(not cell["outputs"] and cell["execution_count"] is None for cell in code), "stored with outputs"
    cells = ["".join(cell["source"]) for cell in code]
    script = tmp_path / "notebook.py"
    script.write_text("\n\n".join([_PRELUDE, *cells, _CODA]), encoding="utf-8")
    environment = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{path.name} failed:\n{done.stderr[-4000:]}"
    shown = int(done.stdout.rsplit("figures shown:", 1)[1])
    assert shown >= 1, "the notebook shows no picture"
