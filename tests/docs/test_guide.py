"""The guide pages' code runs as written: each page's Python blocks, in order, in one namespace."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from composer_fn.core.algorithm import REGISTRY
from composer_fn.testing.settings import SETTINGS

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide"
PAGES = sorted(GUIDE.glob("*.md"))


def python_blocks(page: Path) -> list[str]:
    """Returns the page's fenced ``python`` blocks, in order."""
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)


@pytest.fixture
def registries() -> Iterator[None]:
    # A page registers an algorithm and its check settings; the rest of the suite must not see them.
    algorithms, settings = dict(REGISTRY), dict(SETTINGS)
    yield
    REGISTRY.clear()
    REGISTRY.update(algorithms)
    SETTINGS.clear()
    SETTINGS.update(settings)


def test_the_guide_has_its_pages() -> None:
    assert {"how-it-works.md", "write-your-own-algorithm.md"} <= {page.name for page in PAGES}


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.stem)
def test_the_page_runs_as_written(page: Path, registries: None) -> None:
    # A module of its own, as if the page were a file: dataclasses resolve annotations through sys.modules.
    module = types.ModuleType(f"guide_{page.stem.replace('-', '_')}")
    sys.modules[module.__name__] = module
    try:
        for index, block in enumerate(python_blocks(page)):
            exec(compile(block, f"{page.name}[block {index}]", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]


def test_the_worked_example_is_about_thirty_lines() -> None:
    record = python_blocks(GUIDE / "write-your-own-algorithm.md")[0]
    lines = [line for line in record.splitlines() if line.strip()]
    assert len(lines) <= 36, f"the worked example has {len(lines)} lines"
