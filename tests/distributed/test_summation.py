"""The processes' sum fed from the backward (``Summation``) equals the sum after it, by real gloo processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from composer_fn import optim
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.state import Static, initial_state
from composer_fn.core.time import Timestamp
from composer_fn.trainer.distributed import Summation, all_reduce_sum
from composer_fn.trainer.step import cross_entropy_loss, make_train_step
from tests.distributed.launch import run_ranks


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
        self.unused = nn.Linear(2, 2)  # no gradient reaches it: its hook never fires

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _steps(rank: int) -> dict[str, Any]:
    dist.init_process_group("gloo")
    # Given in another order on each rank, in several dtypes: the buckets still go out in one order.
    shapes = [(5, torch.float32), (3, torch.float64), (7, torch.float32), (1, torch.bfloat16), (4, torch.float32)]
    tensors = [R.normal(R.key(10 * rank + i), (n,)).to(dtype) for i, (n, dtype) in enumerate(shapes)]
    summation = Summation(tensors)
    for index in (range(len(tensors)) if rank == 0 else reversed(range(len(tensors)))):
        if index != 2:  # one is left for result() to give
            summation.add(index, tensors[index])
    fed, after = summation.result(tensors), all_reduce_sum(tensors)

    torch.manual_seed(0)
    model = _Net()
    results = {"fed": fed, "after": after}
    for overlap in (None, Summation):
        tx = optim.sgd(0.1, momentum=0.9)
        state = initial_state(model, R.key(0))
        state = state.replace(opt=tx.init(state.params))
        step = make_train_step(
            Static(module=model),
            make_plan([], timestamp=Timestamp()),
            cross_entropy_loss(),
            tx,
            microbatch_size=3,
            first_sample=rank * 8,
            reduce=all_reduce_sum,
            overlap=overlap,
        )
        for index in range(6):
            size = 8 if rank == 0 or index % 2 else 5  # rank 1's batch is short every other step
            batch = (R.normal(R.key(100 * index + rank), (size, 6)), R.randint(R.key(7 + index), 0, 3, (size,)))
            state, _ = step(state, batch)
        results[str(overlap)] = {"params": state.params, "buffers": state.buffers, "opt": state.opt}
    return results


def test_the_sum_fed_from_the_backward_equals_the_sum_after_it(tmp_path: Path) -> None:
    ranks = run_ranks(_steps, 2, tmp_path)
    for rank in ranks:
        for index, (fed, after) in enumerate(zip(rank["fed"], rank["after"], strict=True)):
            assert fed.dtype == after.dtype and torch.equal(fed, after)
            if fed.dtype != torch.bfloat16:
                parts = [R.normal(R.key(10 * r + index), fed.shape).to(fed.dtype) for r in range(2)]
                assert torch.equal(fed, parts[0] + parts[1]), index
        fed_run, after_run = rank[str(Summation)], rank["None"]
        for one, other in zip(
            torch.utils._pytree.tree_leaves(fed_run), torch.utils._pytree.tree_leaves(after_run), strict=True
        ):
            assert torch.equal(one, other)
    for one, other in zip(
        torch.utils._pytree.tree_leaves(ranks[0][str(Summation)]),
        torch.utils._pytree.tree_leaves(ranks[1][str(Summation)]),
        strict=True,
    ):
        assert torch.equal(one, other)
