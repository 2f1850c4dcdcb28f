"""Reading the application's TOML files (recipes, sweeps): one message for each way a file can fail to be TOML."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["read_toml"]


def read_toml(file: Path, named: str, error: Callable[[str], Exception], example: str) -> dict[str, Any]:
    """Returns the TOML table in ``file``; raises ``error(message)`` where it cannot be read or is not text (the
    message starts with ``named``, how the caller names the file, and points at ``example``), where it is not TOML
    (the message starts with the file's path, as the parser's line and column are in it), or where Python has no
    ``tomllib`` (3.10)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise error(f"{named}: TOML files need Python 3.11 or newer (the standard library's tomllib)") from None
    try:
        with file.open("rb") as stream:
            return tomllib.load(stream)
    except OSError as failure:
        raise error(f"{named}: cannot be read ({failure.strerror or failure}); expected a TOML file, e.g. {example}") from None
    except UnicodeDecodeError:
        raise error(f"{named}: is not text (not UTF-8); expected a TOML file, e.g. {example}") from None
    except tomllib.TOMLDecodeError as failure:
        raise error(f"{file}: not TOML ({failure})") from None
