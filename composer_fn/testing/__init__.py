"""Public testing tools: the algorithm contract suite and hypothesis strategies.

The contract suite (``CHECKS``, ``make_setup``, ``train_steps`` …) is imported here. The strategies live in
``composer_fn.testing.strategies`` and are imported on first use (``from composer_fn.testing import strategies``
or the attribute ``composer_fn.testing.strategies``), since they need hypothesis, a development dependency:
``import composer_fn.testing`` works without it, and the strategies say to ``pip install hypothesis``.
"""

from __future__ import annotations

import importlib
from typing import Any

from composer_fn.testing.contract import (
    CHECKS,
    Setup,
    check_checkpoint_round_trip,
    check_compiled_matches_eager,
    check_composes,
    check_determinism,
    check_dtypes,
    check_keys_matter,
    check_purity,
    check_surgery,
    make_setup,
    train_steps,
)

__all__ = [
    "CHECKS",
    "Setup",
    "check_checkpoint_round_trip",
    "check_compiled_matches_eager",
    "check_composes",
    "check_determinism",
    "check_dtypes",
    "check_keys_matter",
    "check_purity",
    "check_surgery",
    "make_setup",
    "strategies",
    "train_steps",
]


def __getattr__(name: str) -> Any:
    """Returns the submodule ``strategies``, importing it on first use (it needs hypothesis)."""
    if name == "strategies":
        return importlib.import_module(f"{__name__}.strategies")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
