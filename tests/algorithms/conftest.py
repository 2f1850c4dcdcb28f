"""Fixtures shared by the algorithm tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def fresh_compiler() -> Iterator[None]:
    """Runs the test with dynamo's caches emptied before and after, so its compiles neither reuse nor leak."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
