"""Warnings pointed at the user's own line: the first caller outside this package."""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["warn_at_user"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ours(code: object) -> bool:
    filename = code.co_filename  # type: ignore[attr-defined]
    # A dataclass's generated ``__init__`` has no file of its own: it is the record's, so ours.
    generated = filename == "<string>" and code.co_name == "__init__"  # type: ignore[attr-defined]
    return generated or os.path.abspath(filename).startswith(_PACKAGE)


def _outside_package() -> int:
    """Returns the ``stacklevel`` of the first caller outside ``composer_fn``, as seen from ``warnings.warn``'s caller."""
    frame = sys._getframe(2)
    level = 2
    while frame is not None and _ours(frame.f_code):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def warn_at_user(warning: str | Warning) -> None:
    """Warns with ``warning`` (a message: a ``UserWarning``), pointed at the first line outside this package: the
    user's construction of the method, the user's ``Trainer(...)`` or ``fit`` call for a check made on the run."""
    warnings.warn(warning, UserWarning, stacklevel=_outside_package())
