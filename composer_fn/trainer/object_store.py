"""Checkpoints in object stores: a save folder or a checkpoint given as a URL (``s3://bucket/prefix``, ``gs://``, or
any other filesystem ``fsspec`` speaks; ``file://`` is a local path).

A bucket has no rename, so a checkpoint there becomes visible another way than a local one does. A checkpoint file
is uploaded under its own name in one put (S3 makes an object visible only once all its bytes arrived; a put cut
short leaves nothing). A sharded checkpoint's folder is written by every process (DCP's fsspec writer) and counts
once its facts file (``sharded_files.INFO``) is there, which the main process writes last. The object ``latest``
then names the newest checkpoint. Every transfer is retried with backoff on transient errors; a bucket that cannot
be reached, a missing package or missing credentials is one ``ValueError`` when the folder is opened, before any
training.

Credentials and the endpoint come from the store's usual settings: for S3, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``AWS_DEFAULT_REGION`` and ``AWS_ENDPOINT_URL`` (R2, MinIO, a local
server).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from composer_fn.core.extras import install_command

__all__ = ["LATEST", "ObjectFolder", "is_url", "local_path", "split_url", "storage_options", "retried", "opened", "resolved", "fetched_file"]

LATEST = "latest"
"""The object of a save folder in a bucket that names its newest checkpoint (a bucket has no links)."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://")
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
_EXTRAS = {"s3fs": "s3"}
# Errors worth another try: the connection, not the request (a missing object or a refused credential is final).
_FINAL = (FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError, NotADirectoryError)
_TRANSIENT_NAMES = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError"}
ATTEMPTS = 5
"""How many times a transfer is tried before its error is raised (waiting 0.5 s, 1 s, 2 s, 4 s between)."""

T = TypeVar("T")


def is_url(location: object) -> bool:
    """Returns whether ``location`` is a URL of an object store (a string with a scheme other than ``file://``)."""
    if not isinstance(location, str):
        return False
    match = _SCHEME.match(location)
    return match is not None and match.group(1).lower() != "file"


def local_path(location: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """Returns ``location`` with a ``file://`` scheme taken off (a local path either way)."""
    if isinstance(location, str) and location.lower().startswith("file://"):
        return location[len("file://") :]
    return location


def split_url(url: str) -> tuple[str, str]:
    """Returns a checkpoint URL's folder and its last name (``'s3://b/run/ep0-ba2.pt'``: ``'s3://b/run'``,
    ``'ep0-ba2.pt'``)."""
    folder, _, name = url.rstrip("/").rpartition("/")
    return folder, name


def storage_options(url: str) -> dict[str, Any]:
    """Returns the options the filesystem of ``url`` is opened with: for S3, timeouts that make an endpoint that does
    not answer an error within seconds rather than a hang."""
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": 10, "read_timeout": 120}}
    return {}


def _transient(error: BaseException) -> bool:
    if isinstance(error, _FINAL):
        return False
    return isinstance(error, (OSError, TimeoutError)) or type(error).__name__ in _TRANSIENT_NAMES


def retried(what: str, operation: Callable[[], T], *, attempts: int = ATTEMPTS, pause: float = 0.5) -> T:
    """Returns ``operation()``, tried again with exponential backoff (``pause``, doubled each time) while it fails
    with a transient error (a connection refused, reset or timed out), at most ``attempts`` times; the last error,
    or a final one (a missing object, a refused credential), is raised with a note naming ``what``."""
    for attempt in range(attempts):
        try:
            return operation()
        except Exception as error:  # noqa: BLE001 -- a store's client raises its own classes; _transient sorts them
            if not _transient(error) or attempt == attempts - 1:
                if hasattr(error, "add_note"):  # Python 3.11
                    error.add_note(f"while {what} (tried {attempt + 1} times)")
                raise
            time.sleep(pause * 2**attempt)
    raise AssertionError("unreachable")


class ObjectFolder:
    """A folder in an object store, ``url``: what a save folder there needs (list, put, get, remove, small texts),
    each transfer retried (``retried``).

    Raises ValueError naming ``argument`` and the URL when the store's package is not installed, or (with
    ``check``) when the bucket cannot be listed: it does not exist, the credentials are missing or refused, the
    endpoint does not answer.
    """

    def __init__(self, url: str, *, argument: str, check: bool = True) -> None:
        if not is_url(url):
            raise ValueError(f"{argument}={url!r}: expected the URL of a folder in an object store, e.g. 's3://bucket/run'")
        self.url = url.rstrip("/")
        self.argument = argument
        scheme = self.url.split("://", 1)[0].lower()
        try:
            import fsspec

            self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options(self.url))
        except (ImportError, ValueError) as error:
            package = _PACKAGES.get(scheme)
            install = (install_command(_EXTRAS[package]) if package in _EXTRAS else f"pip install {package}") if package else "install fsspec's package for it"
            raise ValueError(f"{argument}={url!r}: no filesystem for {scheme}:// is installed ({error}); {install}") from None
        self.root = self.root.rstrip("/")
        if check:
            self.check()

    def __repr__(self) -> str:
        return f"ObjectFolder({self.url!r})"

    def check(self) -> None:
        """Raises ValueError naming the folder's argument when its bucket cannot be listed."""
        bucket = self.root.split("/", 1)[0]
        try:
            retried(f"listing {self.url}", lambda: self.fs.ls(bucket, detail=False), attempts=2)
        except Exception as error:  # noqa: BLE001 -- any failure to list is the one error the user gets
            reason = str(error).split("\n")[0][:300]
            raise ValueError(
                f"{self.argument}={self.url!r} cannot be used: listing its bucket {bucket!r} failed with "
                f"{type(error).__name__}: {reason}; expected a bucket that exists, with credentials that may read and "
                "write it (for S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE, and AWS_ENDPOINT_URL "
                "for another endpoint than AWS's)"
            ) from None

    def path(self, name: str) -> str:
        """Returns the URL of ``name`` in the folder."""
        return f"{self.url}/{name}"

    def _key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def names(self) -> list[str]:
        """Returns the names directly in the folder (none when it does not exist yet)."""
        try:
            entries = retried(f"listing {self.url}", lambda: self.fs.ls(self.root, detail=False, refresh=True))
        except FileNotFoundError:
            return []
        return sorted(str(entry).rstrip("/").rpartition("/")[2] for entry in entries)

    def exists(self, name: str) -> bool:
        """Returns whether ``name`` (an object, or a folder holding objects) is in the folder."""
        self.fs.invalidate_cache(self._key(name))
        return bool(retried(f"looking up {self.path(name)}", lambda: self.fs.exists(self._key(name))))

    def put(self, source: Path, name: str) -> None:
        """Uploads the local file ``source`` as ``name``, whole or not at all."""
        retried(f"uploading {source} to {self.path(name)}", lambda: self.fs.put_file(str(source), self._key(name)))

    def get(self, name: str, target: Path) -> None:
        """Downloads ``name`` into the local file ``target``."""
        retried(f"downloading {self.path(name)}", lambda: self.fs.get_file(self._key(name), str(target)))

    def write_text(self, name: str, text: str) -> None:
        """Writes ``text`` as the object ``name`` (one put)."""
        retried(f"writing {self.path(name)}", lambda: self.fs.pipe_file(self._key(name), text.encode("utf-8")))

    def read_text(self, name: str) -> str:
        """Returns the text of the object ``name``."""
        data = retried(f"reading {self.path(name)}", lambda: self.fs.cat_file(self._key(name)))
        return bytes(data).decode("utf-8")

    def remove(self, name: str) -> None:
        """Removes ``name`` (an object, or a folder and everything in it); a missing one is not an error."""
        try:
            retried(f"removing {self.path(name)}", lambda: self.fs.rm(self._key(name), recursive=True))
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache(self.root)


def opened(url: str, *, argument: str) -> tuple[ObjectFolder, str]:
    """Returns the folder of the checkpoint URL ``url`` (checked: ``ObjectFolder``) and the checkpoint's name in it."""
    folder_url, name = split_url(url)
    if not is_url(folder_url) or not name:
        raise ValueError(f"{argument}={url!r}: expected the URL of a checkpoint in a bucket, e.g. 's3://bucket/run/ep1-ba20.pt'")
    return ObjectFolder(folder_url, argument=argument), name


def resolved(url: str, *, argument: str) -> str:
    """Returns the URL of the checkpoint ``url`` names: itself, or for ``…/latest`` the checkpoint the folder's
    ``latest`` object names. Raises ValueError naming ``argument`` when its bucket cannot be used (``ObjectFolder``)."""
    folder, name = opened(url, argument=argument)
    if name == LATEST and folder.exists(LATEST):
        return folder.path(folder.read_text(LATEST).strip())
    return url


@contextlib.contextmanager
def fetched_file(url: str, *, argument: str) -> Iterator[Path]:
    """Yields a local copy of the checkpoint file at ``url``, removed on exit."""
    folder, name = opened(url, argument=argument)
    with tempfile.TemporaryDirectory(prefix="composer_fn-") as scratch:
        target = Path(scratch) / name
        try:
            folder.get(name, target)
        except FileNotFoundError:
            raise FileNotFoundError(f"{argument}={url!r} is not a checkpoint: there is no such object") from None
        yield target
