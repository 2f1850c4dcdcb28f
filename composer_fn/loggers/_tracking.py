"""What the experiment-tracker loggers (W&B, MLflow) share: rank 0 only, the file that keeps a tracker run's id
across a resumed run, and a record's numbers as tracker metrics.

A tracker logger opens a tracker run as ``fit`` starts and closes it as ``fit`` ends. A fresh run (``fit`` from
batch 0) opens a new tracker run; a resumed one (``fit`` from a checkpoint's batch) continues the run whose id
the logger holds: its own from an earlier ``fit``, else the one in its ``run_id_file``, else a new run. Every
run it opens writes its id to ``run_id_file``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from composer_fn.core import validate
from composer_fn.loggers._paths import file_path
from composer_fn.loggers.base import Logger
from composer_fn.trainer.object_store import is_url, opened

__all__ = ["TrackerLogger", "main_process", "metrics_of", "artifact_name"]

_SECTIONS = ("train", "eval", "fit")


def main_process() -> bool:
    """Returns whether this process is rank 0 of its run: the process group's rank once one is initialised, else
    torchrun's ``RANK``, else True (one process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    rank = os.environ.get("RANK", "0").strip()
    return not rank.isdigit() or int(rank) == 0


def metrics_of(record: dict[str, Any]) -> dict[str, float]:
    """Returns the numbers of a ``train``, ``eval`` or ``fit`` record, but its step, by tracker name: a name with a
    section (``eval/eval/accuracy``, ``throughput/samples_per_second``) as it is, another under the record's kind
    (``train/loss``, ``eval/wall_time``, ``fit/wall_time``), as ``TensorBoardLogger`` names its scalars."""
    section = str(record["kind"])
    return {
        name if "/" in name else f"{section}/{name}": float(value)
        for name, value in record.items()
        if name not in ("kind", "step") and validate.is_real(value)
    }


def artifact_name(path: Path) -> str:
    """Returns the file name of ``path`` with the characters W&B refuses in an artifact's name replaced by ``-``."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "-" for c in path.name) or "file"


class TrackerLogger(Logger):
    """Base of the loggers that send records to an experiment tracker, on rank 0 only.

    A subclass opens, continues and closes tracker runs (``_open``, ``_close``) and stores metrics, settings, text
    and files (``_metrics``, ``_settings``, ``_text``, ``_file``); this class decides which run to open, keeps
    its id, and turns records into those calls.

    Args:
        run_id_file: the file that keeps the tracker run's id (its folder is created if missing), or None.
        log_artifacts: whether each checkpoint the trainer writes is stored with the tracker run.
    """

    _tracker = "tracker"
    """The tracker's name, as messages give it."""

    def __init__(self, run_id_file: str | os.PathLike[str] | None, log_artifacts: bool) -> None:
        self.run_id_file: Path | str | None = None
        if is_url(run_id_file):  # beside checkpoints in a bucket: checked now, read and written there
            assert isinstance(run_id_file, str)
            opened(run_id_file, argument="run_id_file")
            self.run_id_file = run_id_file
        elif run_id_file is not None:
            self.run_id_file = file_path("run_id_file", run_id_file, "runs/digits/run-id")
        self.log_artifacts = validate.flag("log_artifacts", log_artifacts)
        self.main = main_process()
        """Whether this logger sends anything: only rank 0's does."""
        self.run_id: str | None = None
        """The id of the tracker run this logger opened last (None before its first ``fit``)."""
        self._running = False
        self._plan: list[str] = []
        self._bucket_said = False

    def fit_start(self, step: int) -> None:
        """Opens the tracker run (rank 0 only): a new one for a fresh run (``step`` 0); for a resumed one, the run
        this logger or its ``run_id_file`` names, else a new one. Writes the run's id to ``run_id_file``."""
        self.close()
        self.main = self.main and main_process()
        if not self.main:
            return
        continued = self.run_id if step > 0 else None
        if step > 0 and continued is None and self.run_id_file is not None:
            continued = _read_id(self.run_id_file)
            if continued is None:
                warnings.warn(
                    f"run_id_file={str(self.run_id_file)!r} holds no run id, and this run resumes at batch {step}: "
                    f"its records go to a new {self._tracker} run",
                    stacklevel=2,
                )
        self.run_id = self._open(continued)
        self._running = True
        self._plan = []
        if self.run_id_file is not None:
            _write_id(self.run_id_file, self.run_id)

    def log(self, record: dict[str, Any]) -> None:
        if not self._running:
            return
        kind = record.get("kind")
        if kind in _SECTIONS:
            self._metrics(int(record.get("step", 0)), metrics_of(record), training=kind == "train")
        elif kind == "hparams":
            self._settings({name: value for name, value in record.items() if name != "kind"})
        elif kind == "schedule":
            self._plan.insert(0, str(record["table"]))
        elif kind == "plan":
            switch = "on" if "on" in record else "off"
            self._plan.append(f"batch {record.get('step', '?')}: {', '.join(record.get(switch, []))} {switch}")
        elif kind == "checkpoint" and self.log_artifacts:
            location = str(record["path"])
            if is_url(location):  # kept in its bucket: the tracker run is told where, once
                if not self._bucket_said:
                    warnings.warn(
                        f"log_artifacts=True: checkpoints saved to a bucket ({location}) stay there and are not copied "
                        f"to the {self._tracker} run",
                        stacklevel=2,
                    )
                    self._bucket_said = True
            elif Path(location).exists():
                self._file(Path(location), checkpoint=True)

    def upload_file(self, path: str | os.PathLike[str]) -> None:
        """Stores the file or folder at ``path`` with the tracker run (rank 0 only): during ``fit``, with the run
        it logs to; after it, with the run it logged to last (a report drawn from the run's log, say).

        Raises ValueError for a path that does not exist, or before the logger's first ``fit``.
        """
        if not self.main:
            return
        if isinstance(path, bool) or not isinstance(path, str | os.PathLike):
            raise TypeError(f"path={path!r} must be a file or folder path (a str or os.PathLike)")
        file = Path(path)
        if not file.exists():
            raise ValueError(f"path={str(path)!r} does not exist: expected a file or folder to store with the run")
        if self.run_id is None:
            raise ValueError(
                f"upload_file(path={str(path)!r}) before any fit: the file goes with the tracker run that fit opens; "
                "call it during or after Trainer.fit"
            )
        if self._running:
            self._file(file, checkpoint=False)
        else:
            self._file_after(self.run_id, file)

    def close(self) -> None:
        if not self._running:
            return
        self._running = False
        if self._plan:
            self._text("plan.txt", "\n".join(self._plan) + "\n")
        self._close()

    def _open(self, run_id: str | None) -> str:
        """Opens a new tracker run (``run_id`` None) or continues the run ``run_id``; returns its id."""
        raise NotImplementedError

    def _metrics(self, step: int, metrics: dict[str, float], training: bool) -> None:
        """Stores ``metrics`` at ``step``: those of a training record (``training``) may wait a little."""
        raise NotImplementedError

    def _settings(self, settings: dict[str, Any]) -> None:
        """Stores the run's settings (the ``hparams`` record)."""
        raise NotImplementedError

    def _text(self, name: str, text: str) -> None:
        """Stores ``text`` as the run's file ``name``."""
        raise NotImplementedError

    def _file(self, path: Path, checkpoint: bool) -> None:
        """Stores the file or folder at ``path`` with the open run (a checkpoint, or one given to ``upload_file``)."""
        raise NotImplementedError

    def _file_after(self, run_id: str, path: Path) -> None:
        """Stores the file or folder at ``path`` with the run ``run_id``, which is closed."""
        raise NotImplementedError

    def _close(self) -> None:
        """Closes the open run, once what waits is stored."""
        raise NotImplementedError


def _read_id(path: Path | str) -> str | None:
    try:
        if isinstance(path, str):
            folder, name = opened(path, argument="run_id_file")
            text = folder.read_text(name).strip()
        else:
            text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return text or None


def _write_id(path: Path | str, run_id: str) -> None:
    # Written whole or not at all: a run killed meanwhile leaves the earlier id (an object is put whole).
    if isinstance(path, str):
        folder, name = opened(path, argument="run_id_file")
        folder.write_text(name, run_id + "\n")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(run_id + "\n", encoding="utf-8")
    os.replace(partial, path)
