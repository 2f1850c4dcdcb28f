"""Two processes on CPU gloo: the Trainer's step with its gradient sum next to a hand-written DDP loop.

Usage: python benchmarks/distributed.py [--rounds 5] [--steps 10]

Two processes (one thread each) train the same model from the same weights on fixed per-process batches. Ours
is the step the Trainer runs under torchrun (``make_train_step`` with ``reduce=all_reduce_sum``,
``overlap=Summation`` and donation: bucketed all-reduces of the loss-weighted gradient sums, the loss, the sample
count and the BatchNorm statistics, issued from the last microbatch's backward); the hand loop is
``torch.nn.parallel.DistributedDataParallel`` with ``torch.optim.SGD(momentum=0.9, foreach=True)``. "2 microbatches" is each on the same batch cut in two: ours, and the DDP loop accumulating the
first half's gradient under ``no_sync()``. Rounds alternate the order; the table shows rank 0's median step time.

Targets (printed): ours ≤ 1.10× the DDP loop; 2 microbatches ≤ 1.05× our plain step. Two half batches cost more
than one whole batch in the compute alone (smaller matrix products): the DDP loop's own ratio is printed beside
ours, and so is ours against it at 2 microbatches.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from _peer import format_table
from torch import nn

from composer_fn import optim
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.state import Static, initial_state
from composer_fn.core.time import Timestamp
from composer_fn.models import MLP, SmallCNN
from composer_fn.trainer.distributed import Summation, all_reduce_sum
from composer_fn.trainer.step import cross_entropy_loss, make_train_step

Runner = Callable[[int], None]


def _ours(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], rank: int, microbatches: int) -> Runner:
    static = Static(module=model)
    tx = optim.sgd(0.05, momentum=0.9)
    state = initial_state(model, R.key(0))
    state = state.replace(opt=tx.init(state.params))
    size = batch[0].shape[0] // microbatches
    step = make_train_step(
        static,
        make_plan([], timestamp=Timestamp()),
        cross_entropy_loss(),
        tx,
        donate=True,
        microbatch_size=size,
        first_sample=rank * batch[0].shape[0],
        reduce=all_reduce_sum,
        overlap=Summation,
    )
    holder: dict[str, Any] = {"state": state}

    def run(count: int) -> None:
        for _ in range(count):
            holder["state"], _ = step(holder["state"], batch)

    return run


def _hand(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], microbatches: int) -> Runner:
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, foreach=True)
    parts = list(zip(batch[0].chunk(microbatches), batch[1].chunk(microbatches), strict=True))

    def run(count: int) -> None:
        for _ in range(count):
            optimizer.zero_grad(set_to_none=True)
            for images, labels in parts[:-1]:
                with ddp.no_sync():
                    (F.cross_entropy(ddp(images), labels) / microbatches).backward()
            images, labels = parts[-1]
            (F.cross_entropy(ddp(images), labels) / microbatches).backward()
            optimizer.step()

    return run


def _worker(rank: int, port: int, rounds: int, steps: int, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cases = {
        "digits CNN (SmallCNN), batch 64 a process": (
            SmallCNN(1, 10),
            (R.normal(R.key(3 + rank), (64, 1, 8, 8)), R.randint(R.key(5 + rank), 0, 10, (64,))),
        ),
        "MLP 1024-2048-2048-2048-10 (10.5M parameters), batch 64 a process": (
            MLP(1024, 10, hidden=(2048, 2048, 2048)),
            (R.normal(R.key(7 + rank), (64, 1024)), R.randint(R.key(9 + rank), 0, 10, (64,))),
        ),
    }
    rows = []
    for case, (model, batch) in cases.items():
        runners = {
            "ours": _ours(model, batch, rank, 1),
            "ours, 2 microbatches": _ours(model, batch, rank, 2),
            "DDP loop": _hand(model, batch, 1),
            "DDP loop, 2 microbatches": _hand(model, batch, 2),
        }
        for run in runners.values():
            run(2)  # warm-up
        times: dict[str, list[float]] = {name: [] for name in runners}
        for index in range(rounds):
            order = list(runners) if index % 2 == 0 else list(reversed(runners))
            for name in order:
                dist.barrier()
                began = time.perf_counter()
                runners[name](steps)
                times[name].append((time.perf_counter() - began) / steps)
        median = {name: statistics.median(values) for name, values in times.items()}
        rows.append((case, median))
    dist.destroy_process_group()
    if rank == 0:
        results.put(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps per measurement")
    args = parser.parse_args()
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(_worker, args=(port, args.rounds, args.steps, results), nprocs=2, start_method="spawn")
    rows = results.get()
    print(
        f"training step, 2 processes on CPU gloo, 1 thread each, torch {torch.__version__}; rank 0's median of "
        f"{args.rounds} rounds of {args.steps} steps"
    )
    table = []
    worst_ddp = worst_micro = 0.0
    for case, median in rows:
        ours, micro, hand = median["ours"], median["ours, 2 microbatches"], median["DDP loop"]
        hand_micro = median["DDP loop, 2 microbatches"]
        worst_ddp, worst_micro = max(worst_ddp, ours / hand), max(worst_micro, micro / ours)
        table.append(
            (
                case,
                f"{ours * 1e3:.2f}",
                f"{hand * 1e3:.2f}",
                f"{ours / hand:.2f}×",
                f"{micro * 1e3:.2f}",
                f"{hand_micro * 1e3:.2f}",
                f"{micro / ours:.2f}×",
                f"{hand_micro / hand:.2f}×",
                f"{micro / hand_micro:.2f}×",
            )
        )
    columns = (
        "case",
        "ours ms",
        "DDP ms",
        "ours / DDP",
        "ours 2 mb ms",
        "DDP 2 mb ms",
        "ours 2 mb / ours",
        "DDP 2 mb / DDP",
        "ours 2 mb / DDP 2 mb",
    )
    print(format_table(columns, table))
    print(f"\nours / DDP loop, worst {worst_ddp:.2f}× (target ≤ 1.10×: {'meets' if worst_ddp <= 1.10 else 'misses'})")
    print(
        f"2 microbatches / plain step, worst {worst_micro:.2f}× (target ≤ 1.05×: "
        f"{'meets' if worst_micro <= 1.05 else 'misses'})"
    )


if __name__ == "__main__":
    main()
