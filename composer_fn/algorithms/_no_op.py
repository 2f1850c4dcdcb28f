"""The warnings a method gives when it changes nothing, pointed at the user's own line."""

from __future__ import annotations

import os
import sys
import warnings

from composer_fn.core.algorithm import Algorithm, ChangesNothing

__all__ = ["warn_changes_nothing", "warn_changes_nothing_here", "warn_at_user"]

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


def warn_changes_nothing(record: Algorithm) -> None:
    """Warns (``UserWarning``) with ``record.changes_nothing()`` when it gives a reason: the record's settings make
    it change nothing. Records call it once they are checked, so the warning points at the user's construction."""
    reason = record.changes_nothing()
    if reason is not None:
        warn_at_user(reason)


def warn_changes_nothing_here(algorithm: str, message: str) -> None:
    """Warns ``ChangesNothing(message, algorithm)``: the method of class name ``algorithm`` found on the run (at INIT,
    at the first batch, at the run's length) that it changes nothing there; ``message`` names the setting and why."""
    warn_at_user(ChangesNothing(message, algorithm))
