"""Step time and parameter count before and after each model surgery, on CIFAR ResNet-56 and the causal LM.

Usage: python benchmarks/surgery.py [--threads 1] [--rounds 3] [--steps 3] [--batch 32] [--compile]

Every configuration builds the same model from the same key, runs its algorithms' INIT (the surgery) and times
the eager training step the Trainer runs (``make_train_step`` with the Trainer's donation, SGD with momentum)
on one fixed batch: ResNet-56 on ``[batch, 3, 32, 32]`` images with 10 classes, the CausalLM (d_model 128, 4
blocks, 4 heads) on ``[batch / 2, 128]`` token rows. Rounds rotate the order; tables show the median step time,
its ratio to the unsurgered model, and the parameter count with its change. Methods whose layers a model lacks
(GroupNorm, dropout) are left out of its table; ``--compile`` times inductor-compiled steps instead.

Surgeries whose defaults act on small layers only (Factorize: 256 channels) get the smallest settings that act
on ResNet-56's 16–64 channels; the table names every setting.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch
from _peer import format_table, interleaved_times, pin_threads
from torch import nn

from composer_fn import optim
from composer_fn.algorithms import (
    Alibi,
    BlurPool,
    ChannelsLast,
    Factorize,
    GatedLinearUnits,
    GhostBatchNorm,
    LayerFreezing,
    LowPrecisionLayerNorm,
    SqueezeExcite,
    StochasticDepth,
    WeightStandardization,
)
from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm
from composer_fn.core.engine import frozen_parameters, make_plan, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, Static, initial_state
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.models import CausalLM, cifar_resnet56
from composer_fn.models.lm import causal_lm_loss
from composer_fn.trainer.step import compile_step, cross_entropy_loss, make_train_step

RESNET: dict[str, tuple[Algorithm, ...]] = {
    "ResNet-56 (no surgery)": (),
    "BlurPool()": (BlurPool(),),
    "SqueezeExcite(min_channels=32)": (SqueezeExcite(min_channels=32),),
    "StochasticDepth('BasicBlock', 'block')": (StochasticDepth("BasicBlock", "block"),),
    "StochasticDepth('BasicBlock', 'sample')": (StochasticDepth("BasicBlock", "sample"),),
    "Factorize(min_channels=32, latent_channels=0.25)": (Factorize(min_channels=32, latent_channels=0.25),),
    "WeightStandardization()": (WeightStandardization(),),
    "GhostBatchNorm(ghost_batch_size=8)": (GhostBatchNorm(ghost_batch_size=8),),
    "ChannelsLast()": (ChannelsLast(),),
    "LayerFreezing, half the layers frozen": (LayerFreezing(freeze_start=0.0, freeze_level=1.0),),
}
LM: dict[str, tuple[Algorithm, ...]] = {
    "CausalLM (no surgery)": (),
    "Alibi(train_sequence_length_scaling=1.0)": (Alibi(max_sequence_length=128, train_sequence_length_scaling=1.0),),
    "Alibi() (rows a quarter as long)": (Alibi(max_sequence_length=128),),
    "GatedLinearUnits()": (GatedLinearUnits(),),
    "LowPrecisionLayerNorm()": (LowPrecisionLayerNorm(),),
}
Runner = Callable[[int], None]


def step_runner(
    model: nn.Module, algorithms: tuple[Algorithm, ...], batch: Any, loss_fn: Any, backend: str | None
) -> tuple[Runner, int]:
    """Returns a runner of training steps after the algorithms' INIT, and the parameter count."""
    static = Static(module=model)
    state = initial_state(model, R.key(0))
    steps = 100
    start = Timestamp().with_max_duration(Time(steps, TimeUnit.BATCH))
    static, state = run_host_event(Event.INIT, make_plan(algorithms, timestamp=start), static, state, start)
    tx = optim.sgd(0.05, momentum=0.9)
    state = state.replace(opt=tx.init(state.params), algos={a.name: a.init(static, state) for a in algorithms})
    # Timed half way through the run (LayerFreezing has then frozen half the layers) after an epoch's end.
    now = Timestamp(epoch=1, batch=steps // 2, batch_in_epoch=0).with_max_duration(Time(steps, TimeUnit.BATCH))
    plan = make_plan(algorithms, timestamp=now, meta=BatchMeta(batch[0].shape[0], tuple(batch[0].shape)))
    step = make_train_step(
        static,
        plan,
        loss_fn,
        tx,
        grad_mode="func" if backend else "autograd",
        donate=backend is None,
        frozen=frozen_parameters(algorithms, now, static.module),
    )
    if backend:
        step = compile_step(step, backend)
    holder = {"state": state}

    def run(count: int) -> None:
        for _ in range(count):
            holder["state"], _ = step(holder["state"], batch)

    return run, sum(p.numel() for p in state.params.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="steps per measurement")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--compile", action="store_true", help="time inductor-compiled steps")
    args = parser.parse_args()
    pin_threads(args.threads)
    backend = "inductor" if args.compile else None
    images = R.normal(R.key(1), (args.batch, 3, 32, 32))
    labels = R.randint(R.key(2), 0, 10, (args.batch,))
    rows = R.randint(R.key(3), 0, 96, (max(args.batch // 2, 4), 129))
    tokens = (rows[:, :-1].contiguous(), rows[:, 1:].contiguous())
    groups: dict[str, dict[str, tuple[Runner, int]]] = {
        "CIFAR ResNet-56": {
            name: step_runner(cifar_resnet56(num_classes=10), algorithms, (images, labels), cross_entropy_loss(), backend)
            for name, algorithms in RESNET.items()
        },
        "CausalLM d128×4": {
            name: step_runner(
                CausalLM(96, d_model=128, n_heads=4, n_layers=4, max_seq_len=128),
                algorithms,
                tokens,
                causal_lm_loss(),
                backend,
            )
            for name, algorithms in LM.items()
        },
    }
    samples = interleaved_times(
        {group: {name: run for name, (run, _) in runners.items()} for group, runners in groups.items()},
        args.rounds,
        args.steps,
    )
    mode = "inductor-compiled" if args.compile else "eager"
    print(
        f"training step, {mode}, CPU, {args.threads} thread(s), batch {args.batch} images / {tokens[0].shape[0]} "
        f"rows of 128 tokens, torch {torch.__version__}; median of {args.rounds} rounds of {args.steps} steps"
    )
    for group, runners in groups.items():
        base_time = statistics.median(samples[(group, next(iter(runners)))])
        base_count = next(iter(runners.values()))[1]
        table = []
        for name, (_, count) in runners.items():
            median = statistics.median(samples[(group, name)])
            table.append(
                (
                    name,
                    f"{median * 1e3:.1f}",
                    f"{median / base_time:.2f}×",
                    f"{count:,}",
                    f"{count - base_count:+,}",
                )
            )
        print(f"\n{group}")
        print(format_table(("configuration", "ms/step", "× none", "parameters", "change"), table))


if __name__ == "__main__":
    main()
