"""W&B and MLflow loggers, offline: each tracker holds the metrics the JSON-lines log holds (names, steps, values),
a run resumed from its checkpoint continues the tracker's run, only rank 0 sends anything, checkpoints and files
go with the run, and misconfiguration is one ValueError as the logger is made.

W&B runs in offline mode and is read back from its run files; MLflow keeps its runs in a SQLite file, read back
with its own client. Nothing reaches the network.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from composer_fn import Trainer, optim
from composer_fn import random as R
from composer_fn.data import TensorLoader
from composer_fn.loggers import JSONLLogger, Logger, MLFlowLogger, WandBLogger
from composer_fn.models import MLP
from tests.crashing import Crash

pytest.importorskip("wandb", reason="the W&B logger's tests need wandb: pip install 'composer_fn[wandb]'")
pytest.importorskip("mlflow", reason="the MLflow logger's tests need mlflow: pip install 'composer_fn[mlflow]'")

DATA = (R.normal(R.key(0), (32, 6)), R.randint(R.key(1), 0, 2, (32,)))
Metric = tuple[str, int, float]


@pytest.fixture(scope="module", autouse=True)
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """W&B offline, silent, with every folder it writes under a temporary one and no credentials anywhere."""
    home = tmp_path_factory.mktemp("wandb-home")
    with pytest.MonkeyPatch.context() as patch:
        for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_RUN_ID"):
            patch.delenv(name, raising=False)
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        patch.setenv("WANDB_CONSOLE", "off")
        patch.setenv("WANDB_DISABLE_GIT", "true")
        patch.setenv("WANDB_DISABLE_CODE", "true")
        for name, folder in (("DIR", "runs"), ("DATA_DIR", "data"), ("CACHE_DIR", "cache"), ("CONFIG_DIR", "config")):
            patch.setenv(f"WANDB_{name}", str(home / folder))
        patch.setenv("WANDB_ARTIFACT_DIR", str(home / "artifacts"))
        patch.setenv("NETRC", str(home / "netrc"))  # there is none
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        yield
        import wandb

        wandb.teardown()


@pytest.fixture(scope="module")
def empty_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite store with its tables made (seconds of schema migrations, paid once)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


# Reading the trackers back.


def wandb_records(folder: Path, only: Path | None = None) -> Iterator[Any]:
    """Yields the records of every offline W&B run under ``folder`` (or of its run file ``only``), run by run in
    the order they were made.

    A ``.wandb`` file is a 7-byte header, then records in 32 KiB blocks, each chunk behind a 7-byte header
    (checksum, length, type: whole, first, middle or last), each record a ``wandb_internal_pb2.Record``.
    """
    from wandb.proto import wandb_internal_pb2

    for path in [only] if only is not None else sorted((folder / "wandb").glob("offline-run-*/run-*.wandb")):
        data, position, parts = path.read_bytes(), 7, b""
        while position + 7 <= len(data):
            left = 32768 - position % 32768
            if left < 7:
                position += left
                continue
            _, length, kind = struct.unpack("<IHB", data[position : position + 7])
            chunk = data[position + 7 : position + 7 + length]
            position += 7 + length
            if kind == 0:
                position += left - 7 - length  # the block's zero padding
                continue
            parts = chunk if kind in (1, 2) else parts + chunk
            if kind in (1, 4):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(parts)
                yield record


def wandb_finished(folder: Path, seconds: float = 60.0) -> Path:
    """Returns ``folder`` once every offline W&B run under it holds its exit record: W&B's service writes a run's
    file on its own, and may still be writing when ``finish`` returns on a loaded machine."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        runs = sorted((folder / "wandb").glob("offline-run-*/run-*.wandb"))
        if runs and all(
            any(r.WhichOneof("record_type") == "exit" for r in wandb_records(folder, path)) for path in runs
        ):
            return folder
        time.sleep(0.1)
    return folder


def wandb_metrics(folder: Path) -> list[Metric]:
    """Returns every (name, step, value) in the history rows of the offline W&B runs under ``folder``."""
    wandb_finished(folder)
    return [
        ("/".join(item.nested_key) or item.key, record.history.step.num, float(json.loads(item.value_json)))
        for record in wandb_records(folder)
        if record.WhichOneof("record_type") == "history"
        for item in record.history.item
        if not ("/".join(item.nested_key) or item.key).startswith("_")
    ]


def wandb_run_ids(folder: Path) -> list[str]:
    return [r.run.run_id for r in wandb_records(wandb_finished(folder)) if r.WhichOneof("record_type") == "run"]


def mlflow_metrics(uri: str, run_id: str) -> list[Metric]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return [
        (name, metric.step, metric.value)
        for name in client.get_run(run_id).data.metrics
        for metric in client.get_metric_history(run_id, name)
    ]


def logged_metrics(log: Path) -> list[Metric]:
    """Returns the numbers of the log's training, evaluation and end-of-run records, but their step, each named
    under its record's kind unless its name has a section of its own."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [
        (name if "/" in name else f"{record['kind']}/{name}", record["step"], float(value))
        for record in records
        if record["kind"] in ("train", "eval", "fit")
        for name, value in record.items()
        if name not in ("kind", "step") and isinstance(value, int | float) and not isinstance(value, bool)
    ]


def same(ours: list[Metric], theirs: list[Metric]) -> bool:
    def key(metric: Metric) -> tuple[str, int, float]:
        return metric[0], metric[1], -math.inf if math.isnan(metric[2]) else metric[2]

    return sorted(ours, key=key) == sorted(theirs, key=key)


# Runs.


def _fit(loggers: list[Logger], folder: Path | None = None, **options: Any) -> None:
    Trainer(
        MLP(6, 2),
        TensorLoader(DATA, batch_size=8),
        TensorLoader(DATA, batch_size=16, shuffle=False),
        max_duration="4ba",
        eval_interval="2ba",
        optimizer=optim.sgd(0.1),
        log_interval="1ba",
        loggers=loggers,
        progress_bar=False,
        save_folder=folder,
        save_interval="1ba" if folder is not None else None,
        **options,
    ).fit()


Tracker = tuple[Callable[..., Logger], Callable[[Logger], list[Metric]], Callable[[Logger], int]]


@pytest.fixture(params=["wandb", "mlflow"])
def tracker(request: pytest.FixtureRequest, tmp_path: Path, empty_database: Path) -> Tracker:
    """How to make the tracker's logger, read its metrics back, and count its runs."""
    if request.param == "wandb":
        folder = tmp_path / "wandb"

        def wandb_logger(**options: Any) -> Logger:
            return WandBLogger("digits", mode="offline", dir=folder, **options)

        return wandb_logger, lambda _: wandb_metrics(folder), lambda _: len(set(wandb_run_ids(folder)))
    database = tmp_path / "mlflow.db"
    shutil.copy(empty_database, database)
    uri = f"sqlite:///{database}"

    def mlflow_logger(**options: Any) -> Logger:
        return MLFlowLogger("digits", tracking_uri=uri, **options)

    def runs(logger: Logger) -> int:
        from mlflow.tracking import MlflowClient

        assert isinstance(logger, MLFlowLogger)
        return len(MlflowClient(tracking_uri=uri).search_runs([str(logger.experiment_id)]))

    return mlflow_logger, lambda logger: mlflow_metrics(uri, str(logger.run_id)), runs


def test_the_tracker_holds_every_metric_of_the_log_at_its_step(tracker: Tracker, tmp_path: Path) -> None:
    make, metrics, runs = tracker
    logger = make()
    _fit([logger, JSONLLogger(tmp_path / "log.jsonl")])
    expected = logged_metrics(tmp_path / "log.jsonl")
    assert {name for name, _, _ in expected} >= {"train/loss", "train/lr_multiplier", "eval/eval/accuracy", "fit/wall_time"}
    assert {step for _, step, _ in expected} == {1, 2, 3, 4}
    assert same(metrics(logger), expected)
    assert runs(logger) == 1


def test_a_resumed_run_continues_the_trackers_run_from_its_checkpoint(tracker: Tracker, tmp_path: Path) -> None:
    make, metrics, runs = tracker
    run_id_file = tmp_path / "checkpoints" / "run-id"
    first, log = make(run_id_file=run_id_file), JSONLLogger(tmp_path / "log.jsonl")
    with pytest.raises(KeyboardInterrupt, match="crash at batch 2"):
        _fit([first, log], tmp_path / "checkpoints", callbacks=[Crash(2)])
    first.close()  # the process ends
    log.close()
    assert run_id_file.read_text().strip() == first.run_id
    resumed = make(run_id_file=run_id_file)
    _fit([resumed, JSONLLogger(tmp_path / "log.jsonl")], tmp_path / "checkpoints", autoresume=True)
    assert resumed.run_id == first.run_id
    expected = logged_metrics(tmp_path / "log.jsonl")
    assert sorted({step for _, step, _ in expected}) == [1, 2, 3, 4]
    assert len([m for m in expected if m[0] == "train/loss"]) == 4  # no step twice
    assert same(metrics(resumed), expected)
    assert runs(resumed) == 1


def test_a_fresh_run_starts_a_new_trackers_run_and_keeps_its_id(tracker: Tracker, tmp_path: Path) -> None:
    make, _, runs = tracker
    run_id_file = tmp_path / "run-id"
    first, second = make(run_id_file=run_id_file), make(run_id_file=run_id_file)
    _fit([first])
    _fit([second])
    assert first.run_id != second.run_id
    assert run_id_file.read_text().strip() == second.run_id
    assert runs(second) == 2


def test_a_logger_on_another_rank_sends_nothing(tracker: Tracker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make, _, _ = tracker
    monkeypatch.setenv("RANK", "1")  # as torchrun sets it; without WORLD_SIZE the trainer runs alone
    logger = make(run_id_file=tmp_path / "run-id")
    _fit([logger])
    assert logger.run_id is None and not (tmp_path / "run-id").exists()
    assert not (tmp_path / "wandb").exists()


def test_the_settings_the_plan_checkpoints_and_files_go_with_the_wandb_run(tmp_path: Path) -> None:
    logger = WandBLogger("digits", mode="offline", dir=tmp_path, log_artifacts=True)
    _feed(logger, tmp_path)
    records = list(wandb_records(wandb_finished(tmp_path)))
    config = {
        item.key: json.loads(item.value_json)
        for record in records
        if record.WhichOneof("record_type") == "config"
        for item in record.config.update
    }
    assert config["max_duration"] == "4ba" and config["algorithms"] == [{"name": "mixup", "alpha": 0.2}]
    files = [f.path for r in records if r.WhichOneof("record_type") == "files" for f in r.files.files]
    assert "plan.txt" in files
    plan = next(tmp_path.glob("wandb/offline-run-*/files/plan.txt")).read_text()
    assert plan == "the table\nbatch 3: mixup off\n"
    artifacts = [(r.artifact.name, r.artifact.type) for r in records if r.WhichOneof("record_type") == "artifact"]
    assert artifacts == [("ep0-ba2.pt", "checkpoint"), ("report.png", "file")]
    assert set(wandb_run_ids(tmp_path)) == {logger.run_id}


def test_the_settings_the_plan_checkpoints_and_files_go_with_the_mlflow_run(tmp_path: Path, empty_database: Path) -> None:
    from mlflow.tracking import MlflowClient

    shutil.copy(empty_database, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = MLFlowLogger("digits", tracking_uri=uri, tags={"team": "vision"}, log_artifacts=True)
    _feed(logger, tmp_path)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(str(logger.run_id))
    assert run.info.status == "FINISHED" and run.data.tags["team"] == "vision"
    assert run.data.params["max_duration"] == "4ba"
    assert json.loads(run.data.params["algorithms"]) == [{"name": "mixup", "alpha": 0.2}]
    stored = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert stored == {"plan.txt", "checkpoints", "report.png"}
    assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")] == ["checkpoints/ep0-ba2.pt"]
    assert (tmp_path / "mlartifacts").is_dir()  # beside the database, not in the working folder


def _feed(logger: WandBLogger | MLFlowLogger, folder: Path) -> None:
    # What the trainer hands a logger in a run with an algorithm and a checkpoint; then a report drawn after it.
    checkpoint, report = folder / "ep0-ba2.pt", folder / "report.png"
    checkpoint.write_bytes(b"weights")
    report.write_bytes(b"png")
    logger.fit_start(0)
    logger.log({"kind": "hparams", "max_duration": "4ba", "algorithms": [{"name": "mixup", "alpha": 0.2}], "seed": 0})
    logger.log({"kind": "schedule", "table": "the table"})
    logger.log({"kind": "train", "step": 1, "epoch": 0, "loss": 0.5})
    logger.log({"kind": "checkpoint", "step": 2, "path": str(checkpoint)})
    logger.log({"kind": "plan", "step": 3, "off": ["mixup"]})
    logger.close()
    logger.upload_file(report)


def test_a_file_before_any_run_or_missing_is_refused_naming_it(tmp_path: Path) -> None:
    logger = WandBLogger("digits", mode="disabled")
    with pytest.raises(ValueError, match=r"path='.*missing.png' does not exist"):
        logger.upload_file(tmp_path / "missing.png")
    (tmp_path / "report.png").write_bytes(b"png")
    with pytest.raises(ValueError, match=r"upload_file\(path=.*\) before any fit"):
        logger.upload_file(tmp_path / "report.png")


# Misconfiguration.


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_wandb_online_without_credentials_is_refused_as_the_logger_is_made(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^mode='online' needs W&B credentials.*WANDB_API_KEY.*mode='offline'"):
        WandBLogger("digits", mode="online", dir=tmp_path)
    WandBLogger("digits", mode="offline", dir=tmp_path)
    WandBLogger("digits", mode="disabled")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"mode": "dryrun"}, r"^mode='dryrun' must be one of 'online', 'offline', 'disabled'"),
        ({"project": "a/b"}, r"^project='a/b': W&B project names may not hold"),
        ({"tags": "baseline"}, r"^tags='baseline' must be a sequence of str"),
        ({"tags": ["x" * 65]}, r"must be a str of 1 to 64 characters"),
        ({"log_artifacts": 1}, r"^log_artifacts=1 must be True or False"),
    ],
)
def test_a_bad_wandb_argument_is_refused_naming_it(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        WandBLogger(**{"mode": "offline", **arguments})


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("ftp://host/runs", r"^tracking_uri='ftp://host/runs': the scheme 'ftp' is not a tracking store"),
        ("http://127.0.0.1:{port}", r"^tracking_uri='http://127.0.0.1:\d+': the tracking server does not answer"),
        ("postgresql://127.0.0.1:{port}/runs", r"^tracking_uri='postgresql://.*': the database at 127.0.0.1:\d+ does not answer"),
    ],
)
def test_a_bad_tracking_uri_is_refused_at_once_naming_it(uri: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    started = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        MLFlowLogger("digits", tracking_uri=uri.format(port=_closed_port()))
    assert time.perf_counter() - started < 5.0


def test_a_deleted_experiment_is_refused_naming_it(tmp_path: Path, empty_database: Path) -> None:
    from mlflow.tracking import MlflowClient

    shutil.copy(empty_database, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    client.delete_experiment(client.create_experiment("old"))
    with pytest.raises(ValueError, match=r"experiment_name='old': the experiment is deleted"):
        MLFlowLogger("old", tracking_uri=uri)


# Recipes and imports.


def test_a_recipes_tracker_tables_build_the_loggers_with_their_ids_in_the_save_folder(tmp_path: Path, empty_database: Path) -> None:
    from composer_fn.app.recipes import Recipe, RecipeError

    shutil.copy(empty_database, tmp_path / "mlflow.db")
    tables = {
        "wandb": {"project": "digits", "mode": "offline", "dir": str(tmp_path), "tags": ["baseline"]},
        "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment_name": "digits"},
    }
    wandb, mlflow = Recipe(tmp_path / "recipe.toml", {}, loggers=tables).build_loggers(tmp_path / "runs")
    assert isinstance(wandb, WandBLogger) and wandb.project == "digits" and wandb.tags == ("baseline",)
    assert wandb.run_id_file == tmp_path / "runs" / "wandb-run-id"
    assert isinstance(mlflow, MLFlowLogger) and mlflow.experiment_name == "digits"
    assert mlflow.run_id_file == tmp_path / "runs" / "mlflow-run-id"
    with pytest.raises(RecipeError, match=r"field loggers.wandb: unknown argument 'projcet'; accepted: project \(default None\), name"):
        Recipe(tmp_path / "recipe.toml", {}, loggers={"wandb": {"projcet": "x"}}).build_loggers()
    with pytest.raises(RecipeError, match=r"field loggers.mlflow: 'x': expected a table of MLFlowLogger's arguments"):
        Recipe(tmp_path / "recipe.toml", {}, loggers={"mlflow": "x"}).build_loggers()


def test_importing_the_package_and_its_loggers_loads_neither_tracker() -> None:
    code = "import sys, composer_fn, composer_fn.loggers\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('wandb', 'mlflow')))"
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert finished.stdout.strip().splitlines()[-1] == "[]"
