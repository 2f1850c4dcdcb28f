"""Optimizer update time on the CPU: our SGD and AdamW next to torch.optim on the same gradients.

A ResNet-like set of parameter tensors (about 10M values: convolution kernels, BatchNorm vectors, a linear head)
and one fixed set of gradients. Each contender performs the update of one training step:

- ours as the eager Trainer runs it: ``opt = tx.fused(params, grads, opt, 1.0)``, the whole step in place on
  the state the Trainer owns (donated), with torch's arithmetic (its fused kernels where the device has them);
- ours pure: ``fused_step`` copies the parameters and the state, then runs the same step on the copies;
- ours functional: ``tx.update`` + ``apply_updates`` (new tensors), what a compiled step traces (run eagerly
  here, without inductor's fusion);
- ``torch.optim`` with ``foreach=True`` (its default on the CPU is the per-tensor loop) and with
  ``fused=True``: ``opt.step()`` with ``p.grad`` set.

Every contender runs ``--steps`` updates per measurement, in ``--rounds`` rounds that rotate the order; tables
show the median per-update time and the ratio to torch's foreach path. Target: the Trainer's path ≤ 1.10× torch
(foreach).
One intra-op thread by default.

    .venv/bin/python benchmarks/optim.py [--threads 1] [--rounds 7] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from _peer import format_table, pin_threads

from composer_fn import optim
from composer_fn.core import random as R
from composer_fn.optim.base import apply_updates
from composer_fn.optim.fused import fused_step


def parameter_shapes() -> list[tuple[int, ...]]:
    """Returns the shapes of a ResNet-like model of about 10M parameters."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    for width, blocks in ((64, 3), (128, 4), (256, 4), (320, 2)):
        for _ in range(blocks):
            shapes += [(width, width, 3, 3), (width,), (width,), (width, width, 3, 3), (width,), (width,)]
    shapes += [(1000, 320), (1000,)]
    return shapes


def tensors(seed: int) -> dict[str, torch.Tensor]:
    """Returns keyed normal tensors of every shape, by name."""
    return {f"p{i}": R.normal(R.key(seed + i), shape) * 0.05 for i, shape in enumerate(parameter_shapes())}


Contender = Callable[[int], None]


def ours(make: Callable[[], optim.GradientTransformation], grads: dict[str, torch.Tensor], mode: str) -> Contender:
    """Returns a runner of ``steps`` updates of our optimizer in ``mode``: donated, pure or functional."""
    params = {k: v.clone() for k, v in tensors(0).items()}
    tx = make()
    state = {"opt": tx.init(params), "params": params}
    assert tx.fused is not None

    def run(steps: int) -> None:
        for _ in range(steps):
            if mode == "donated":
                state["opt"] = tx.fused(state["params"], grads, state["opt"], 1.0)
            elif mode == "pure":
                state["params"], state["opt"] = fused_step(tx, state["params"], grads, state["opt"])
            else:
                updates, state["opt"] = tx.update(grads, state["opt"], state["params"])
                state["params"] = apply_updates(state["params"], updates)

    return run


def torch_optim(make: Callable[[list[torch.Tensor]], torch.optim.Optimizer], grads: dict[str, torch.Tensor]) -> Contender:
    """Returns a runner of ``steps`` updates of a torch optimizer with the same gradients."""
    params = [torch.nn.Parameter(v.clone()) for v in tensors(0).values()]
    for parameter, grad in zip(params, grads.values(), strict=True):
        parameter.grad = grad.clone()
    optimizer = make(params)

    def run(steps: int) -> None:
        for _ in range(steps):
            optimizer.step()

    return run


MODES = {
    "ours, eager Trainer (donated)": "donated",
    "ours, pure (fused_step)": "pure",
    "ours, functional update": "functional",
}
"""Our three ways to run an optimizer: the eager trainer's in-place step on the state it owns, the same step
on copies (nothing given is changed), and ``update`` + ``apply_updates`` (what a compiled step traces)."""


def contenders(grads: dict[str, torch.Tensor]) -> dict[str, dict[str, Contender]]:
    """Returns the contenders of each optimizer, torch's foreach path first."""
    sgd_args = {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}
    adamw_args = {"lr": 1e-3, "weight_decay": 0.01}
    return {
        "SGD (momentum 0.9, Nesterov, weight decay)": {
            "torch.optim.SGD, foreach": torch_optim(lambda p: torch.optim.SGD(p, foreach=True, **sgd_args), grads),
            "torch.optim.SGD, fused": torch_optim(lambda p: torch.optim.SGD(p, fused=True, **sgd_args), grads),
            **{
                name: ours(lambda: optim.sgd(0.1, momentum=0.9, nesterov=True, weight_decay=5e-4), grads, mode)
                for name, mode in MODES.items()
            },
        },
        "AdamW (weight decay 0.01)": {
            "torch.optim.AdamW, foreach": torch_optim(lambda p: torch.optim.AdamW(p, foreach=True, **adamw_args), grads),
            "torch.optim.AdamW, fused": torch_optim(lambda p: torch.optim.AdamW(p, fused=True, **adamw_args), grads),
            **{name: ours(lambda: optim.adamw(1e-3, weight_decay=0.01), grads, mode) for name, mode in MODES.items()},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="updates per measurement")
    args = parser.parse_args()
    pin_threads(args.threads)
    grads = tensors(10_000)
    count = sum(g.numel() for g in grads.values())
    groups = contenders(grads)
    samples: dict[tuple[str, str], list[float]] = {}
    for round_index in range(args.rounds):
        for group, runners in groups.items():
            names = list(runners)
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                runner = runners[name]
                runner(1)
                start = time.perf_counter()
                runner(args.steps)
                samples.setdefault((group, name), []).append((time.perf_counter() - start) / args.steps)
    print(
        f"optimizer update, {count / 1e6:.1f}M parameters in {len(grads)} tensors, float32, CPU, "
        f"{args.threads} thread(s), torch {torch.__version__}; median of {args.rounds} rounds of {args.steps} updates"
    )
    for group, runners in groups.items():
        baseline = statistics.median(samples[(group, next(iter(runners)))])
        rows = []
        for name in runners:
            median = statistics.median(samples[(group, name)])
            rows.append((name, f"{median * 1e3:.2f}", f"{median / baseline:.2f}×"))
        print(f"\n{group}")
        print(format_table(("contender", "ms/update", "× torch foreach"), rows))
        for name in runners:
            if name.startswith("ours, eager Trainer"):
                ratio = statistics.median(samples[(group, name)]) / baseline
                print(f"  target ≤ 1.10× torch foreach: {ratio:.2f}× ({'met' if ratio <= 1.10 else 'NOT met'})")


if __name__ == "__main__":
    main()
