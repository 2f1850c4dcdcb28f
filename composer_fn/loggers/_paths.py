"""Checks of the paths that loggers and the profiler write to: each raises naming the argument, the value and what
is accepted, before anything is written."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["folder_path", "file_path"]


def _text(argument: str, value: object, kind: str, example: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | os.PathLike):
        raise TypeError(f"{argument}={value!r} must be {kind} path (a str or os.PathLike), e.g. {example!r}")
    text = os.fspath(value)
    if not isinstance(text, str):
        raise TypeError(f"{argument}={value!r} must be {kind} path given as text (str), e.g. {example!r}")
    if not text.strip():
        raise ValueError(f"{argument}={value!r} is empty: expected {kind} path, e.g. {example!r}")
    return text


def _creatable(argument: str, text: str, path: Path, kind: str) -> None:
    # The nearest part of the path that exists must be a folder this process may write in.
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(
            f"{argument}={text!r} cannot be created: {str(existing)!r} is a file, not a folder; expected {kind} path "
            "that can be written"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"{argument}={text!r} cannot be created: the folder {str(existing)!r} is not writable; expected {kind} "
            "path that can be written"
        )


def folder_path(argument: str, value: object, example: str) -> Path:
    """Returns ``value`` as a ``Path`` if it names a folder that exists or can be created, and can be written.

    Raises TypeError for what is not a path (None, a number) and ValueError, naming ``argument`` and the value, for
    an empty path, an existing file, or a place where the folder cannot be created or written. Creates nothing.
    """
    text = _text(argument, value, "a folder", example)
    path = Path(text)
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{argument}={text!r} is a file: expected a folder path (created if missing), e.g. {example!r}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{argument}={text!r} is a folder that is not writable: expected a folder that can be written")
        return path
    _creatable(argument, text, path, "a folder")
    return path


def file_path(argument: str, value: object, example: str) -> Path:
    """Returns ``value`` as a ``Path`` if it names a file that exists or can be created, and can be written.

    Raises TypeError for what is not a path (None, a number) and ValueError, naming ``argument`` and the value, for
    an empty path, an existing folder, or a place where the file cannot be created or written. Creates nothing.
    """
    text = _text(argument, value, "a file", example)
    path = Path(text)
    if text.endswith(("/", os.sep)) or path.is_dir():
        raise ValueError(f"{argument}={text!r} is a folder: expected a file path (created if missing), e.g. {example!r}")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ValueError(f"{argument}={text!r} is a file that is not writable: expected a file that can be written")
        return path
    _creatable(argument, text, path.parent, "a file")
    return path
