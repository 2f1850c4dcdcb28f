"""The warnings a method gives when it changes nothing, pointed at the user's own line.

A record whose settings change nothing warns when it is built (``Algorithm.changes_nothing``, read by the
``Algorithm`` base); the warnings here are those a method gives on what it finds on the run.
"""

from __future__ import annotations

from composer_fn.core._user_line import warn_at_user
from composer_fn.core.algorithm import ChangesNothing

__all__ = ["warn_changes_nothing_here", "warn_at_user"]


def warn_changes_nothing_here(algorithm: str, message: str) -> None:
    """Warns ``ChangesNothing(message, algorithm)``: the method of class name ``algorithm`` found on the run (at INIT,
    at the first batch, at the run's length) that it changes nothing there; ``message`` names the setting and why."""
    warn_at_user(ChangesNothing(message, algorithm))
