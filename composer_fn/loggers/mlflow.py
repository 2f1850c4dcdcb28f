"""MLflow destination for the trainer's records (``pip install -e '.[mlflow]'``).

``MLFlowLogger`` sends, on rank 0 only: the run's settings as the MLflow run's params; each training,
evaluation and end-of-run record's numbers as metrics at its step, named as ``TensorBoardLogger`` names its
scalars (``train/loss``, ``eval/eval/accuracy``, ``fit/wall_time``), so each metric's history is the JSON-lines
log's; the plan of the run (as ``composer-fn plan`` prints it, and where algorithms switched on and off) as the
artifact ``plan.txt``; each checkpoint under ``checkpoints/`` when ``log_artifacts``; and any file through
``upload_file``. ``mlflow`` is imported when a logger is made, never by ``import composer_fn``.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from composer_fn.core.extras import install_command
from composer_fn.loggers._paths import file_path, folder_path
from composer_fn.loggers._tracking import TrackerLogger, artifact_name

__all__ = ["MLFlowLogger", "SCHEMES", "PROBE_SECONDS"]

SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
"""The tracking URI schemes ``MLFlowLogger`` accepts (a database's may name its driver: ``postgresql+psycopg2``);
a path without a scheme is a local folder, as ``file:``."""

PROBE_SECONDS = 5.0
"""How long the logger waits for a tracking server or database to answer as it is made, in seconds."""

_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
_BATCH = 1000  # MLflow takes at most 1000 metrics, and 100 params, in one batch
_PARAMS = 100
_PARAM_LENGTH = 6000  # the longest param value MLflow 2 and 3 both store


class MLFlowLogger(TrackerLogger):
    """Sends records to an MLflow run, opened as ``fit`` starts and ended (``FINISHED``) as it ends (rank 0 only).

    The tracking URI and the experiment are checked here, within ``PROBE_SECONDS``, so that a misconfigured
    tracker is one ValueError before training rather than a stall at its start: a scheme MLflow does not have,
    a server or database that does not answer, a store or experiment that cannot be read or made (the
    experiment is made when missing).

    A run resumed from a checkpoint continues the MLflow run it was logging to (its ``run_id``) when this logger
    did that run's first ``fit`` or ``run_id_file`` names it: put the file beside the checkpoints (the command
    line uses ``<save_folder>/mlflow-run-id``). MLflow does not change a param once logged: a resumed run's
    settings add the params the run lacks and leave the others as its first ``fit`` logged them. Metrics logged
    twice at a step (a run that went on past its checkpoint before it stopped) keep both values.

    Args:
        experiment_name: the experiment the run belongs to, made if missing (None: ``MLFLOW_EXPERIMENT_NAME``,
            else MLflow's ``Default``).
        run_name: the run's name (None: one MLflow makes up).
        tracking_uri: where runs are kept: ``sqlite:///runs/mlflow.db``, ``http://host:5000``, a folder,
            ``databricks``, ... (see ``SCHEMES``; None: ``MLFLOW_TRACKING_URI``, else MLflow's default).
        tags: the run's tags, by name.
        artifact_location: where an experiment this logger makes keeps its runs' files (None: beside the database
            file, in ``mlartifacts``, for a ``sqlite`` URI; the store's default otherwise).
        run_id_file: the file that keeps the MLflow run's id for a resumed run (its folder is created if
            missing): a fresh run writes its new run's id there, a resumed one continues the run it names. None:
            a resumed run continues only the run this logger logged to in this process, else starts a new one.
        log_artifacts: store each checkpoint the trainer writes with the run, under ``checkpoints/``.
    """

    _tracker = "MLflow"

    def __init__(
        self,
        experiment_name: str | None = None,
        *,
        run_name: str | None = None,
        tracking_uri: str | os.PathLike[str] | None = None,
        tags: Mapping[str, str] | None = None,
        artifact_location: str | None = None,
        run_id_file: str | os.PathLike[str] | None = None,
        log_artifacts: bool = False,
    ) -> None:
        try:
            import mlflow
            from mlflow.tracking import MlflowClient
        except ImportError as error:
            raise ImportError(f"MLFlowLogger needs the mlflow package ({error}): {install_command('mlflow')}") from None
        super().__init__(run_id_file, log_artifacts)
        given = tracking_uri
        if tracking_uri is not None and isinstance(tracking_uri, os.PathLike):
            tracking_uri = os.fspath(tracking_uri)
        if tracking_uri is not None and not isinstance(tracking_uri, str):
            raise TypeError(f"tracking_uri={given!r} must be a str (e.g. 'sqlite:///runs/mlflow.db'), a path or None")
        self.tracking_uri: str = tracking_uri if tracking_uri is not None else str(mlflow.get_tracking_uri())
        shown = f"tracking_uri={given!r}" + ("" if given is not None else f" (MLflow's {self.tracking_uri!r})")
        self.experiment_name = _name("experiment_name", experiment_name) or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
        self.run_name = _name("run_name", run_name)
        self.tags = _tags(tags)
        if artifact_location is not None and (not isinstance(artifact_location, str) or not artifact_location.strip()):
            raise ValueError(f"artifact_location={artifact_location!r} must be a folder or URI (a non-empty str) or None")
        scheme = _checked_scheme(shown, self.tracking_uri)
        if artifact_location is None and scheme == "sqlite":
            database = _sqlite_file(self.tracking_uri)
            if database is not None:
                artifact_location = (database.parent.absolute() / "mlartifacts").as_uri()
        self.artifact_location = artifact_location
        self._client: Any = None
        self.experiment_id: str | None = None
        """The id of the experiment the runs go to (None on a rank other than 0, which sends nothing)."""
        if self.main:
            _probe(shown, self.tracking_uri, scheme)
            self.experiment_id = self._experiment(shown, lambda: MlflowClient(tracking_uri=self.tracking_uri))
        self._pending: list[Any] = []
        self._sent = time.monotonic()
        self._params: set[str] = set()

    def _experiment(self, shown: str, client: Callable[[], Any]) -> str:
        """Returns the id of the experiment the runs go to, made if missing, with the client ``client`` makes."""
        named = f"{shown}, experiment_name={self.experiment_name!r}"
        try:
            self._client = client()
            experiment = self._client.get_experiment_by_name(self.experiment_name)
            if experiment is None:
                return str(self._client.create_experiment(self.experiment_name, artifact_location=self.artifact_location))
        except Exception as error:  # any failure of the store (driver, schema, refusal) is the configuration's
            raise ValueError(f"{named}: the tracking store cannot be read or written ({_first_line(error)})") from None
        if experiment.lifecycle_stage != "active":
            raise ValueError(
                f"{named}: the experiment is deleted; restore it (mlflow experiments restore) or name another"
            )
        return str(experiment.experiment_id)

    def _open(self, run_id: str | None) -> str:
        self._pending, self._sent, self._params = [], time.monotonic(), set()
        if run_id is not None:
            try:
                run = self._client.get_run(run_id)
            except Exception:
                warnings.warn(
                    f"the MLflow run {run_id!r} is not in {self.tracking_uri!r}: this run's records go to a new run",
                    stacklevel=3,
                )
            else:
                self._params = set(run.data.params)
                self._client.update_run(run_id, status="RUNNING")
                return run_id
        run = self._client.create_run(self.experiment_id, run_name=self.run_name, tags=dict(self.tags))
        return str(run.info.run_id)

    def _metrics(self, step: int, metrics: dict[str, float], training: bool) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._pending += [Metric(name, value, now, step) for name, value in metrics.items()]
        # Training records come every few steps: sent together, once a second at most; the others at once.
        if not training or len(self._pending) >= _BATCH or time.monotonic() - self._sent >= 1.0:
            self._send()

    def _send(self) -> None:
        pending, self._pending, self._sent = self._pending, [], time.monotonic()
        for start in range(0, len(pending), _BATCH):
            self._client.log_batch(self.run_id, metrics=pending[start : start + _BATCH])

    def _settings(self, settings: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [
            Param(name, _param(value)) for name, value in sorted(settings.items()) if name not in self._params
        ]
        for start in range(0, len(params), _PARAMS):
            self._client.log_batch(self.run_id, params=params[start : start + _PARAMS])
        self._params |= {param.key for param in params}

    def _text(self, name: str, text: str) -> None:
        self._client.log_text(self.run_id, text, name)

    def _file(self, path: Path, checkpoint: bool) -> None:
        self._store(self.run_id, path, "checkpoints" if checkpoint else None)

    def _file_after(self, run_id: str, path: Path) -> None:
        self._store(run_id, path, None)

    def _store(self, run_id: str | None, path: Path, folder: str | None) -> None:
        if path.is_dir():
            inside = artifact_name(path) if folder is None else f"{folder}/{artifact_name(path)}"
            self._client.log_artifacts(run_id, str(path), artifact_path=inside)
        else:
            self._client.log_artifact(run_id, str(path), artifact_path=folder)

    def _close(self) -> None:
        self._send()
        self._client.set_terminated(self.run_id, status="FINISHED")


def _name(argument: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{argument}={value!r} must be a str or None")
    if not value.strip():
        raise ValueError(f"{argument}={value!r} is empty: expected a name or None")
    return value


def _tags(tags: object) -> dict[str, str]:
    if tags is None:
        return {}
    if not isinstance(tags, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise TypeError(f"tags={tags!r} must be a mapping of str to str, e.g. {{'team': 'vision'}}, or None")
    return dict(tags)


def _param(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= _PARAM_LENGTH else text[: _PARAM_LENGTH - 3] + "..."


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _checked_scheme(shown: str, uri: str) -> str:
    """Returns the scheme of ``uri`` (``file`` for a path without one), its driver left out; raises ValueError
    for one MLflow does not have, or a local store that cannot be written."""
    scheme = urllib.parse.urlparse(uri).scheme.lower()
    if len(scheme) <= 1:  # a path, or a Windows drive letter
        folder_path("tracking_uri", uri, "runs/mlruns")
        return "file"
    base = scheme.split("+", 1)[0]
    if base not in SCHEMES:
        raise ValueError(
            f"{shown}: the scheme {scheme!r} is not a tracking store MLflow has; expected one of "
            f"{', '.join(SCHEMES)} (e.g. 'sqlite:///runs/mlflow.db', 'http://localhost:5000'), or a folder"
        )
    if base == "file":
        folder_path("tracking_uri", urllib.request.url2pathname(urllib.parse.urlparse(uri).path), "file:///runs/mlruns")
    if base == "sqlite":
        database = _sqlite_file(uri)
        if database is not None:
            file_path("tracking_uri", database, "sqlite:///runs/mlflow.db")
    return base


def _sqlite_file(uri: str) -> Path | None:
    """Returns the database file of a ``sqlite:`` URI (three slashes: a relative path; four: an absolute one), or
    None for an in-memory database."""
    path = uri.split(":", 1)[1].split("?", 1)[0]
    path = path[3:] if path.startswith("///") else path.lstrip("/")
    return Path(path) if path and path != ":memory:" else None


def _probe(shown: str, uri: str, scheme: str) -> None:
    """Raises ValueError when the server or database at ``uri`` does not answer within ``PROBE_SECONDS``."""
    if scheme in ("http", "https"):
        parts = urllib.parse.urlparse(uri)
        query = urllib.parse.urlencode({"experiment_name": "Default"})
        url = urllib.parse.urlunparse(parts._replace(path=parts.path.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name", query=query))
        try:
            with urllib.request.urlopen(url, timeout=PROBE_SECONDS):
                return
        except urllib.error.HTTPError:
            return  # it answered: whether it lets us in is the client's to say
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            if "CERTIFICATE" in str(reason).upper():
                return  # it answered over TLS; MLflow's own certificate settings may accept it
            raise ValueError(
                f"{shown}: the tracking server does not answer within {PROBE_SECONDS:g} s ({reason}); start it, or "
                "fix the URI"
            ) from None
    if scheme in _PORTS:
        parts = urllib.parse.urlparse(uri)
        host, port = parts.hostname or "localhost", parts.port or _PORTS[scheme]
        try:
            with socket.create_connection((host, port), timeout=PROBE_SECONDS):
                return
        except OSError as error:
            raise ValueError(
                f"{shown}: the database at {host}:{port} does not answer within {PROBE_SECONDS:g} s "
                f"({error.strerror or error}); start it, or fix the URI"
            ) from None
