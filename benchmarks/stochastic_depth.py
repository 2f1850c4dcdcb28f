"""StochasticDepth's step time at drop rates 0, 0.5 and 1, eager and compiled, next to Composer's.

Usage: python benchmarks/stochastic_depth.py [--threads 1] [--rounds 3] [--steps 4] [--batch 32] [--compile]
    [--no-peer] [--peer-python PATH]

Each configuration builds the same model from the same key, runs StochasticDepth's INIT (the surgery) and
times the training step the Trainer runs (``surgery.step_runner``: ``make_train_step`` with SGD and momentum
0.9, eager with the Trainer's donation, or inductor-compiled with ``--compile``) on one fixed batch. Rates are
``'uniform'``, so a rate is the fraction of blocks (``'block'``) or of samples (``'sample'``) dropped on
average; rounds rotate the order, and the table shows the median step time and its ratio to the model without
the surgery.

- CIFAR ResNet-20 (nine ``BasicBlock``s) on ``[batch, 3, 32, 32]`` images.
- A torchvision ``ResNet(Bottleneck, [1, 1, 1, 1])`` (four ``Bottleneck``s, three of them with a projection
  shortcut) on the same images, the only block Composer's StochasticDepth accepts. In the same run and
  alternating rounds with ours, the peer interpreter times Composer 0.32.1's ``apply_stochastic_depth`` on the
  same architecture in a hand-written loop (``torch.optim.SGD(momentum=0.9, foreach=True)``, eager, its own
  initial weights), against that loop without the surgery: each side's ratio is to its own unsurgered model.

Eagerly, a dropped block skips its branch, so time falls as the rate rises; compiled, the step keeps one
graph and computes every branch, so the rate changes nothing.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from _peer import (
    Peer,
    PeerError,
    add_common_arguments,
    find_peer_python,
    format_table,
    interleaved_times,
    pin_threads,
)
from surgery import step_runner
from torch import nn

from composer_fn.algorithms import StochasticDepth
from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm
from composer_fn.models import cifar_resnet20
from composer_fn.nn import materialise
from composer_fn.trainer.step import cross_entropy_loss

RATES = (0.0, 0.5, 1.0)
Runner = Callable[[int], None]

PEER_SOURCE = r'''
import torch
import torch.nn.functional as F

def setup():
    torch.set_num_threads(THREADS)
    global apply_stochastic_depth, ResNet, Bottleneck
    import composer
    from composer.algorithms.stochastic_depth import apply_stochastic_depth
    from torchvision.models.resnet import Bottleneck, ResNet
    return {"composer": composer.__version__, "torch": torch.__version__}

RUNS = {}

def build(configuration, batch, method, rate):
    torch.manual_seed(0)
    model = ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10).train()
    if method is not None:
        apply_stochastic_depth(model, "ResNetBottleneck", method, rate, "uniform")
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(batch, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (batch,), generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)
    RUNS[configuration] = (model, optimizer, images, labels)

def run(configuration, count):
    model, optimizer, images, labels = RUNS[configuration]
    for _ in range(count):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
'''


def _configurations(target: str) -> dict[str, tuple[Algorithm, ...]]:
    configurations: dict[str, tuple[Algorithm, ...]] = {"no surgery": ()}
    for rate in RATES:
        configurations[f"'block', rate {rate:g}"] = (StochasticDepth(target, "block", rate, "uniform"),)
    configurations["'sample', rate 0.5"] = (StochasticDepth(target, "sample", 0.5, "uniform"),)
    return configurations


def _bottleneck_resnet() -> nn.Module:
    from torchvision.models.resnet import Bottleneck, ResNet

    with torch.device("meta"):
        model = ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10)
    return materialise(model, R.key(0))


def _peer_runners(args: argparse.Namespace, batch: int) -> tuple[dict[str, Runner], Peer | None, str]:
    """Returns the peer's runners by configuration, the peer, and why there are none (or '')."""
    python = None if args.no_peer else find_peer_python(args.peer_python)
    if python is None:
        return {}, None, "the peer column was skipped (--no-peer, or no peer interpreter found)"
    peer = Peer(python, PEER_SOURCE, threads=args.threads, timeout=600).start()
    try:
        info = peer.wait_ready()
        runners: dict[str, Runner] = {}
        for name, algorithms in _configurations("ResNetBottleneck").items():
            method, rate = (algorithms[0].stochastic_method, algorithms[0].drop_rate) if algorithms else (None, 0.0)
            peer.call("build", configuration=name, batch=batch, method=method, rate=rate)
            runners[name] = lambda count, name=name: peer.call("run", configuration=name, count=count)
    except PeerError as error:
        peer.close()
        return {}, None, f"the peer column was skipped: {error}"
    return runners, peer, f"Composer {info['composer']}, torch {info['torch']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="steps per measurement")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--compile", action="store_true", help="time inductor-compiled steps (no peer column)")
    args = parser.parse_args()
    pin_threads(args.threads)
    backend = "inductor" if args.compile else None
    images = R.normal(R.key(1), (args.batch, 3, 32, 32))
    labels = R.randint(R.key(2), 0, 10, (args.batch,))
    batch, loss_fn = (images, labels), cross_entropy_loss()
    groups: dict[str, dict[str, Runner]] = {
        "CIFAR ResNet-20 (BasicBlock)": {
            name: step_runner(cifar_resnet20(num_classes=10), algorithms, batch, loss_fn, backend)[0]
            for name, algorithms in _configurations("BasicBlock").items()
        },
        "ResNet(Bottleneck, [1, 1, 1, 1])": {
            name: step_runner(_bottleneck_resnet(), algorithms, batch, loss_fn, backend)[0]
            for name, algorithms in _configurations("ResNetBottleneck").items()
        },
    }
    peer_runners, peer, peer_note = ({}, None, "compiled: no peer column") if args.compile else _peer_runners(
        args, args.batch
    )
    if peer_runners:
        groups["Composer: ResNet(Bottleneck, [1, 1, 1, 1])"] = peer_runners
    try:
        samples = interleaved_times(groups, args.rounds, args.steps)
    finally:
        if peer is not None:
            peer.close()
    mode = "inductor-compiled" if args.compile else "eager"
    print(
        f"training step, {mode}, CPU, {args.threads} thread(s), batch {args.batch} images 32×32, torch "
        f"{torch.__version__}; median of {args.rounds} rounds of {args.steps} steps; peer: {peer_note}"
    )
    for group, runners in groups.items():
        medians = {name: statistics.median(samples[(group, name)]) for name in runners}
        base = medians["no surgery"]
        table = [(name, f"{median * 1e3:.1f}", f"{median / base:.2f}×") for name, median in medians.items()]
        print(f"\n{group}")
        print(format_table(("StochasticDepth", "ms/step", "× none"), table))


if __name__ == "__main__":
    main()
