"""A fault on one process ends every process with an error, within dist_timeout, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.launch import free_port

WORKER = Path(__file__).with_name("fault_worker.py")
ROOT = Path(__file__).parents[2]


def _run_two(fault: str) -> tuple[list[int], list[str]]:
    # A process still running after 90 s (four times dist_timeout) hangs: communicate raises TimeoutExpired.
    port = free_port()
    processes = []
    for rank in range(2):
        environment = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            PYTHONPATH=str(ROOT),
        )
        processes.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), fault], env=environment, stderr=subprocess.PIPE, text=True, cwd=ROOT
            )
        )
    errors = [process.communicate(timeout=90)[1] for process in processes]
    return [process.returncode for process in processes], errors


@pytest.mark.parametrize("fault", ["kill", "raise"])
def test_a_process_that_dies_or_raises_ends_the_other_with_an_error_naming_it(fault: str) -> None:
    codes, errors = _run_two(fault)
    assert codes[0] != 0 and codes[1] != 0
    assert "rank 0 of 2: step 3 failed in a collective" in errors[0]
    assert "dist_timeout=20 s" in errors[0]


def test_a_nan_loss_on_one_process_stops_every_process_naming_the_step() -> None:
    codes, errors = _run_two("nan")
    # Each process reports the step and exits with 1 (it leaves the process group first: no abort at exit).
    assert codes == [1, 1], errors
    for error in errors:
        assert "FloatingPointError: step 1 (epoch 0)" in error, error
