"""Which Python and NumPy scalars count as bools, integers and real numbers.

The lowest of the core's modules: ``core.time`` and ``core.validate`` both read these, and it imports neither.
"""

from __future__ import annotations

import numbers
from typing import TypeGuard


def is_bool(value: object) -> bool:
    """Returns whether ``value`` is a ``bool`` or a NumPy bool scalar."""
    # NumPy's bool scalar type is ``numpy.bool`` (``numpy.bool_`` before NumPy 2).
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def is_integer(value: object) -> TypeGuard[int]:
    """Returns whether ``value`` is an integer (``int``, ``numpy.int64``, any ``numbers.Integral``) and not a bool."""
    return type(value) is int or (isinstance(value, numbers.Integral) and not is_bool(value))


def is_real(value: object) -> TypeGuard[int | float]:
    """Returns whether ``value`` is a real number (``float``, ``numpy.float32``, any ``numbers.Real``) and not a bool
    (finite or not)."""
    return type(value) is float or type(value) is int or (isinstance(value, numbers.Real) and not is_bool(value))
