"""Loggers receive records (plain dicts of numbers and strings) from the trainer and store them somewhere."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

__all__ = ["Logger", "JSONLLogger", "InMemoryLogger"]


class Logger:
    """Base class of logger destinations."""

    def log(self, record: dict[str, Any]) -> None:
        """Stores one record: ``{"kind": "train" | "eval" | "hparams" | "fit", ...}``."""
        raise NotImplementedError

    def close(self) -> None:
        """Flushes and releases the destination."""


class JSONLLogger(Logger):
    """Appends one JSON object per record to a file (one record per logged step and per evaluation)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(
                f"path={str(path)!r}: its folder cannot be created ({error.strerror or error}); expected a file "
                "path that can be written"
            ) from None
        self._stream: TextIO | None = None

    def log(self, record: dict[str, Any]) -> None:
        if self._stream is None:
            self._stream = self.path.open("a", encoding="utf-8")
        self._stream.write(json.dumps(record, sort_keys=True) + "\n")

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


class InMemoryLogger(Logger):
    """Keeps every record in ``records`` (for tests and notebooks)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def log(self, record: dict[str, Any]) -> None:
        self.records.append(dict(record))
