"""Mixed precision: the Trainer's training step in fp32, bf16-mixed and fp16-mixed next to a hand-written loop.

Usage: python benchmarks/precision.py [--threads 1] [--rounds 5] [--steps 20]

Both sides run the same model from the same initial weights on one fixed batch, eagerly: ours is the step the
Trainer runs (``make_train_step`` with donation, ``optim.sgd(0.05, momentum=0.9)``; in fp16 with its dynamic
loss scale in ``State.hparams``), the hand loop is ``torch.autocast`` around the forward and the loss,
``torch.optim.SGD(momentum=0.9, foreach=True)`` and, in fp16, ``torch.amp.GradScaler``. Rounds rotate the
order; the table shows the median step time and ours over the hand loop's.

Target (printed): fp16-mixed step ≤ 1.10× the hand loop with a GradScaler.
"""

from __future__ import annotations

import argparse
import copy
import statistics
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from _peer import format_table, interleaved_times, pin_threads
from torch import nn

from composer_fn import optim
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.state import Static, initial_state
from composer_fn.core.time import Timestamp
from composer_fn.models import MLP, SmallCNN
from composer_fn.trainer.loss_scale import DynamicLossScale
from composer_fn.trainer.step import cross_entropy_loss, make_train_step

PRECISIONS = {"fp32": None, "bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}
Runner = Callable[[int], None]


def _ours(model: nn.Module, precision: str, batch: tuple[torch.Tensor, torch.Tensor]) -> Runner:
    static = Static(module=model, precision=precision)  # type: ignore[arg-type]
    tx = optim.sgd(0.05, momentum=0.9)
    state = initial_state(model, R.key(0))
    state = state.replace(opt=tx.init(state.params))
    if precision == "fp16-mixed":
        state = state.replace(hparams=DynamicLossScale().init())
    step = make_train_step(static, make_plan([], timestamp=Timestamp()), cross_entropy_loss(), tx, donate=True)
    holder: dict[str, Any] = {"state": state}

    def run(count: int) -> None:
        for _ in range(count):
            holder["state"], _ = step(holder["state"], batch)

    return run


def _hand(model: nn.Module, precision: str, batch: tuple[torch.Tensor, torch.Tensor]) -> Runner:
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)
    dtype = PRECISIONS[precision]
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16-mixed" else None
    images, labels = batch

    def run(count: int) -> None:
        for _ in range(count):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=dtype) if dtype is not None else nullcontext():
                loss = F.cross_entropy(model(images), labels)
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per measurement")
    args = parser.parse_args()
    pin_threads(args.threads)
    cases = {
        "MLP 256-512-512-10, batch 256": (
            MLP(256, 10, hidden=(512, 512)),
            (R.normal(R.key(1), (256, 256)), R.randint(R.key(2), 0, 10, (256,))),
        ),
        "SmallCNN, 8×8 digits-sized, batch 128": (
            SmallCNN(1, 10),
            (R.normal(R.key(3), (128, 1, 8, 8)), R.randint(R.key(4), 0, 10, (128,))),
        ),
    }
    groups = {
        f"{case}, {precision}": {"ours": _ours(model, precision, batch), "hand": _hand(model, precision, batch)}
        for case, (model, batch) in cases.items()
        for precision in PRECISIONS
    }
    samples = interleaved_times(groups, args.rounds, args.steps)
    print(
        f"training step, eager, CPU, {args.threads} thread(s), torch {torch.__version__}; median of {args.rounds} "
        f"rounds of {args.steps} steps"
    )
    rows = []
    fp16_ratios = []
    for group in groups:
        ours, hand = (statistics.median(samples[(group, name)]) for name in ("ours", "hand"))
        rows.append((group, f"{ours * 1e6:.0f}", f"{hand * 1e6:.0f}", f"{ours / hand:.2f}×"))
        if group.endswith("fp16-mixed"):
            fp16_ratios.append(ours / hand)
    print(format_table(("case, precision", "ours µs/step", "hand µs/step", "ours / hand"), rows))
    worst = max(fp16_ratios)
    print(f"\nfp16-mixed: ours / hand loop with GradScaler, worst case {worst:.2f}× (target ≤ 1.10×: "
          f"{'meets' if worst <= 1.10 else 'misses'})")


if __name__ == "__main__":
    main()
