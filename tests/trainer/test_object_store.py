"""Checkpoints in a bucket, against a local S3 server: saved every few batches with ``latest`` moved last, the
newest complete one taken by autoresume, a process killed mid-upload resumed bit for bit, partial checkpoints
never taken, transient errors retried, and a bucket that cannot be used refused before training."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from composer_fn import EMA, MixUp, Trainer, optim
from composer_fn import random as R
from composer_fn.data import TensorLoader
from composer_fn.models import MLP
from composer_fn.trainer import load_model
from composer_fn.trainer.checkpoint import (
    autoresume_path,
    convert_checkpoint,
    newest_checkpoint,
    save_folder_of,
)
from composer_fn.trainer.object_store import LATEST, ObjectFolder, retried
from composer_fn.trainer.sharded_files import INFO
from tests.local_s3 import forget_clients, local_s3, new_bucket

DATA = (R.normal(R.key(0), (32, 6)), R.randint(R.key(1), 0, 2, (32,)))
ROOT = Path(__file__).resolve().parents[2]


def _trainer(**options) -> Trainer:
    # Eight batches an epoch; MixUp draws from the run's key and EMA keeps state of its own: both resume exactly.
    arguments = {"max_duration": "6ba", "optimizer": optim.adamw(0.01), "progress_bar": False, **options}
    torch.manual_seed(0)
    return Trainer(MLP(6, 2, hidden=(8,)), TensorLoader(DATA, batch_size=4, seed=3), algorithms=[MixUp(), EMA()], **arguments)


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in trainer.state.params.items()}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with local_s3() as url:
        yield url


@pytest.fixture
def bucket(endpoint: str) -> str:
    return new_bucket()


def _listing(url: str) -> list[str]:
    return ObjectFolder(url, argument="test").names()


def test_a_run_saves_into_a_bucket_moves_latest_last_and_reads_back_in_one_process(bucket: str, tmp_path: Path) -> None:
    run = f"{bucket}/run"
    trainer = _trainer(save_folder=run, save_interval="2ba", save_num_checkpoints_to_keep=2)
    trainer.fit()
    assert _listing(run) == ["ep0-ba4.pt", "ep0-ba6.pt", LATEST]
    assert ObjectFolder(run, argument="test").read_text(LATEST) == "ep0-ba6.pt"
    assert newest_checkpoint(save_folder_of(run)) == f"{run}/ep0-ba6.pt"
    # Read whole in one process: the module (EMA's average, as evaluation uses), and a file converted from it.
    expected = dict(trainer.model.named_parameters())
    loaded = load_model(f"{run}/{LATEST}", MLP(6, 2, hidden=(8,)))
    assert all(torch.equal(value, expected[name]) for name, value in loaded.named_parameters())
    convert_checkpoint(f"{run}/ep0-ba6.pt", tmp_path / "whole.pt")
    converted = load_model(tmp_path / "whole.pt", MLP(6, 2, hidden=(8,)))
    assert all(torch.equal(value, expected[name]) for name, value in converted.named_parameters())
    # A run resumed from the bucket's checkpoint of batch 4 ends where the run ended.
    resumed = _trainer(load_path=f"{run}/ep0-ba4.pt")
    assert resumed.timestamp.batch == 4
    resumed.fit()
    assert all(torch.equal(value, trainer.state.params[name]) for name, value in resumed.state.params.items())


def _killed_mid_upload(run: str) -> None:
    # Run in a child process: the upload of the second checkpoint sends half its bytes, then the process is killed.
    import signal

    calls = []
    real = ObjectFolder.put

    def put_then_die(self: ObjectFolder, source: Path, name: str) -> None:
        calls.append(name)
        if len(calls) < 2:
            return real(self, source, name)
        data = source.read_bytes()
        with self.fs.open(self._key(name), "wb") as stream:
            stream.write(data[: len(data) // 2])
            stream.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    ObjectFolder.put = put_then_die  # type: ignore[method-assign]
    _trainer(save_folder=run, save_interval="2ba").fit()


def test_a_process_killed_mid_upload_leaves_the_previous_checkpoint_which_autoresume_continues_bitwise(bucket: str) -> None:
    run = f"{bucket}/run"
    code = f"from tests.trainer.test_object_store import _killed_mid_upload; _killed_mid_upload({run!r})"
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr[-3000:]
    # The killed upload left nothing under its name; latest still names the first checkpoint.
    assert _listing(run) == ["ep0-ba2.pt", LATEST]
    assert ObjectFolder(run, argument="test").read_text(LATEST) == "ep0-ba2.pt"
    resumed = _trainer(save_folder=run, save_interval="2ba", autoresume=True)
    assert resumed.timestamp.batch == 2
    resumed.fit()
    uninterrupted = _trainer()
    uninterrupted.fit()
    assert _weights(resumed).keys() == _weights(uninterrupted).keys()
    assert all(torch.equal(value, uninterrupted.state.params[name]) for name, value in resumed.state.params.items())
    assert _listing(run) == ["ep0-ba2.pt", "ep0-ba4.pt", "ep0-ba6.pt", LATEST]


def test_a_sharded_folder_without_the_run_s_facts_is_never_taken_and_autoresume_removes_it(bucket: str) -> None:
    run = f"{bucket}/run"
    _trainer(save_folder=run, save_interval="2ba", max_duration="2ba").fit()
    folder = ObjectFolder(run, argument="test")
    folder.write_text("ep0-ba4/.metadata", "written by a process killed before the run's facts")
    folder.write_text("ep0-ba4/__0_0.distcp", "shards")
    assert newest_checkpoint(folder) == f"{run}/ep0-ba2.pt"
    assert autoresume_path(folder, None) == f"{run}/ep0-ba2.pt"
    assert _listing(run) == ["ep0-ba2.pt", LATEST]  # the partial folder removed
    folder.write_text("ep0-ba6/.metadata", "index")
    folder.write_text(f"ep0-ba6/{INFO}", "{}")
    assert newest_checkpoint(folder) == f"{run}/ep0-ba6"  # complete once the facts are there


def test_a_missing_bucket_missing_credentials_and_a_missing_checkpoint_are_one_error_before_training(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=r"save_folder='s3://no-such-bucket/run' cannot be used: listing its bucket 'no-such-bucket'"):
        _trainer(save_folder="s3://no-such-bucket/run")
    bucket = new_bucket()
    with pytest.raises(FileNotFoundError, match=rf"load_path='{bucket}/run/ep0-ba2.pt' is not a checkpoint: there is no such object"):
        _trainer(load_path=f"{bucket}/run/ep0-ba2.pt")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    forget_clients()
    try:
        with pytest.raises(ValueError, match=r"cannot be used: .*NoCredentialsError.*AWS_ACCESS_KEY_ID"):
            _trainer(save_folder=f"{bucket}/run")
    finally:
        forget_clients()


def test_a_scheme_without_its_package_names_what_to_install() -> None:
    with pytest.raises(ValueError, match=r"save_folder='nosuchscheme://b/run': no filesystem for nosuchscheme://"):
        ObjectFolder("nosuchscheme://b/run", argument="save_folder")


def test_transfers_are_retried_with_backoff_on_transient_errors_only(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr("composer_fn.trainer.object_store.time.sleep", pauses.append)
    failures = [ConnectionResetError("reset"), TimeoutError("slow")]

    def flaky() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    assert retried("uploading", flaky) == "done" and pauses == [0.5, 1.0]
    pauses.clear()

    def missing() -> None:
        raise FileNotFoundError("no such key")

    with pytest.raises(FileNotFoundError, match="no such key"):
        retried("downloading", missing)
    assert pauses == []  # a missing object is final

    def down() -> None:
        raise ConnectionRefusedError("refused")

    with pytest.raises(ConnectionRefusedError) as raised:
        retried("uploading x", down)
    assert pauses == [0.5, 1.0, 2.0, 4.0]
    if sys.version_info >= (3, 11):
        assert raised.value.__notes__ == ["while uploading x (tried 5 times)"]


def test_the_command_line_saves_into_a_bucket_and_resumes_from_its_latest(bucket: str, tmp_path: Path) -> None:
    from composer_fn.app.cli import main

    run = f"{bucket}/cli"
    common = ["train", "--task", "digits-mlp", "--no-progress", "--save-folder", run, "--save-interval", "1ba"]
    assert main([*common, "--max-duration", "2ba"]) == 0
    assert _listing(run) == ["ep0-ba1.pt", "ep0-ba2.pt", LATEST]
    assert main([*common, "--max-duration", "3ba", "--autoresume"]) == 0
    assert ObjectFolder(run, argument="test").read_text(LATEST) == "ep0-ba3.pt"
    assert main(["convert", f"{run}/{LATEST}", "--output", str(tmp_path / "whole.pt")]) == 0
    assert (tmp_path / "whole.pt").stat().st_size > 0
