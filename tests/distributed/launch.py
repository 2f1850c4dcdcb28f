"""Starts real processes for the distributed tests: ``torch.multiprocessing`` with gloo on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _entry(rank: int, world_size: int, port: int, folder: str, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    try:
        result = function(rank, *args)
    except BaseException:
        Path(folder, f"error-{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    torch.save(result, Path(folder, f"result-{rank}.pt"))


def run_ranks(function: Callable[..., Any], world_size: int, folder: Path, *args: Any) -> list[Any]:
    """Returns what ``function(rank, *args)`` returned in each of ``world_size`` fresh processes.

    Each process has torchrun's environment (RANK, WORLD_SIZE, ...); a Trainer built in it joins the group. A
    failure in any process raises here with that process's traceback.
    """
    port = free_port()
    try:
        mp.start_processes(
            _entry, args=(world_size, port, str(folder), function, args), nprocs=world_size, start_method="spawn"
        )
    except Exception as error:
        messages = [p.read_text() for p in sorted(folder.glob("error-*.txt"))]
        raise AssertionError("\n".join(messages) or str(error)) from error
    return [torch.load(Path(folder, f"result-{rank}.pt"), weights_only=False) for rank in range(world_size)]
