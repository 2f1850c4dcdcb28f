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
(foreach). A last table times whole eager training steps on the digits CNN, plain and SAM, ours and by hand in
torch; target: our SAM step ≤ 2.1× our plain step.
One intra-op thread by default.

    .venv/bin/python benchmarks/optim.py [--threads 1] [--rounds 7] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch
from _peer import format_table, interleaved_times, pin_threads

from composer_fn import optim
from composer_fn.algorithms import SAM
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.state import State, Static, initial_state
from composer_fn.data import load_digits_task
from composer_fn.models import SmallCNN
from composer_fn.optim.base import apply_updates
from composer_fn.optim.fused import fused_step
from composer_fn.trainer.step import cross_entropy_loss, make_train_step


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


SAM_GROUP = "Whole training step, SmallCNN on 64 digits (SGD, momentum 0.9; SAM rho 0.05)"


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


def sam_contenders() -> dict[str, Contender]:
    """Returns runners of whole training steps on the digits CNN: ours plain and SAM, torch by hand plain and SAM.

    Ours are the eager Trainer's step functions (``make_train_step`` with the trainer's donation). The hand
    loops use ``torch.optim.SGD`` (foreach); the hand SAM step is the two-pass reference: backward, perturb by
    ``rho · g / ||g||``, backward again, restore, step.
    """
    task = load_digits_task()
    images, labels = task.train[0][:64].contiguous(), task.train[1][:64].contiguous()
    tx = optim.sgd(0.1, momentum=0.9)
    runners: dict[str, Contender] = {}
    for name, algorithms in (("ours, plain step", ()), ("ours, SAM step", (SAM(),))):
        model = SmallCNN(1, 10)
        static = Static(module=model)
        state = initial_state(model, R.key(0))
        plan = make_plan(algorithms)
        state = state.replace(opt=tx.init(state.params), algos={a.name: a.init(static, state) for a in algorithms})
        step = make_train_step(static, plan, cross_entropy_loss(), tx, donate=True)
        holder = {"state": state}

        def run(steps: int, step: Any = step, holder: dict[str, State] = holder) -> None:
            for _ in range(steps):
                holder["state"], _ = step(holder["state"], (images, labels))

        runners[name] = run
    for name, sharpness in (("torch by hand, plain step", False), ("torch by hand, SAM step", True)):
        runners[name] = _hand_step(images, labels, sharpness)
    return runners


def _hand_step(images: torch.Tensor, labels: torch.Tensor, sharpness: bool) -> Contender:
    model = SmallCNN(1, 10)
    parameters = list(model.parameters())
    optimizer = torch.optim.SGD(parameters, lr=0.1, momentum=0.9, foreach=True)

    def run(steps: int) -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            if sharpness:
                grads = [p.grad for p in parameters]
                norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
                shifts = torch._foreach_mul(grads, 0.05 / (float(norm) + 1e-12))
                with torch.no_grad():
                    torch._foreach_add_(parameters, shifts)
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(images), labels).backward()
                with torch.no_grad():
                    torch._foreach_sub_(parameters, shifts)
            optimizer.step()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="updates per measurement")
    args = parser.parse_args()
    pin_threads(args.threads)
    grads = tensors(10_000)
    count = sum(g.numel() for g in grads.values())
    groups = {**contenders(grads), SAM_GROUP: sam_contenders()}
    samples = interleaved_times(groups, args.rounds, args.steps)
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
        print(format_table(("contender", "ms/update", "× first row"), rows))
        for name in runners:
            if name.startswith("ours, eager Trainer"):
                ratio = statistics.median(samples[(group, name)]) / baseline
                print(f"  target ≤ 1.10× torch foreach: {ratio:.2f}× ({'met' if ratio <= 1.10 else 'NOT met'})")
    sam, plain = (statistics.median(samples[(SAM_GROUP, n)]) for n in ("ours, SAM step", "ours, plain step"))
    by_hand = statistics.median(samples[(SAM_GROUP, "torch by hand, SAM step")]) / statistics.median(
        samples[(SAM_GROUP, "torch by hand, plain step")]
    )
    verdict = "met" if sam / plain <= 2.1 else "NOT met"
    print(f"  SAM step / plain step: ours {sam / plain:.2f}× (target ≤ 2.1×: {verdict}), torch by hand {by_hand:.2f}×")


if __name__ == "__main__":
    main()
