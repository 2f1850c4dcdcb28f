"""Loggers receive records (plain dicts of numbers and strings) from the trainer and store them somewhere."""

from __future__ import annotations

import json
import os
from typing import Any, TextIO

from composer_fn.core import validate
from composer_fn.loggers._paths import file_path

__all__ = ["Logger", "JSONLLogger", "InMemoryLogger"]


class Logger:
    """Base class of logger destinations."""

    def fit_start(self, step: int) -> None:
        """Prepares the destination as ``fit`` starts, before its first record.

        Args:
            step: the batch the run starts from: 0 for a fresh run, the checkpoint's batch for a resumed one.
        """

    def log(self, record: dict[str, Any]) -> None:
        """Stores one record: ``{"kind": "train" | "eval" | "hparams" | "fit", ...}``."""
        raise NotImplementedError

    def close(self) -> None:
        """Flushes and releases the destination."""


class JSONLLogger(Logger):
    """Writes one JSON object per record to a file (one record per logged step and per evaluation).

    A run resumed from a checkpoint appends to the file. A fresh run refuses, as ``fit`` starts, a file that
    already holds records (an earlier run's: two runs in one log read as steps 1, 2, 1, 2), unless
    ``overwrite=True``, which replaces them.

    Args:
        path: the file (its folder is created if missing).
        overwrite: whether a fresh run replaces what the file holds; a resumed run always appends.
    """

    def __init__(self, path: str | os.PathLike[str], overwrite: bool = False) -> None:
        self.path = file_path("path", path, "runs/log.jsonl")
        self.overwrite = validate.flag("overwrite", overwrite)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(
                f"path={str(path)!r}: its folder cannot be created ({error.strerror or error}); expected a file "
                "path that can be written"
            ) from None
        self._stream: TextIO | None = None
        self._mode = "a"

    def fit_start(self, step: int) -> None:
        """Refuses a fresh run (``step`` 0) whose file already holds records, unless ``overwrite``; a resumed run
        appends."""
        self.close()
        self._mode = "a"
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return
        self._refuse_other_files()
        if step > 0:
            return
        if self.overwrite:
            self._mode = "w"
            return
        with self.path.open("rb") as stream:
            lines = sum(1 for line in stream if line.strip())
        raise ValueError(
            f"path={str(self.path)!r} already holds {lines} lines of an earlier run's log, and this run starts fresh "
            "(not resumed from a checkpoint): its records would follow them in one file. Delete the file, write to "
            "another path, or pass overwrite=True (--overwrite-log on the command line) to replace it"
        )

    def _refuse_other_files(self) -> None:
        # A file whose first line is no JSON object is not a log (a checkpoint, a table): neither appended to nor
        # replaced, whatever ``overwrite`` says.
        with self.path.open("rb") as stream:
            first = stream.readline(1 << 20)
        try:
            is_log = isinstance(json.loads(first.decode("utf-8")), dict)
        except (UnicodeDecodeError, ValueError):
            is_log = False
        if not is_log:
            raise ValueError(
                f"path={str(self.path)!r} holds something other than a JSON-lines log (its first line is not a JSON "
                "object: a checkpoint, a table?), so it is neither appended to nor replaced; expected a log "
                "file or a new path"
            )

    def log(self, record: dict[str, Any]) -> None:
        stream = self._stream
        if stream is None:
            stream = self._stream = self.path.open("w" if self._mode == "w" else "a", encoding="utf-8")
            self._mode = "a"
        stream.write(json.dumps(record, sort_keys=True) + "\n")

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
