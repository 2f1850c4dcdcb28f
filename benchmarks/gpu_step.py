"""Training-step time on a GPU: the compiled Trainer, alone and with each data algorithm, next to a hand loop.

Every contender trains the same SmallCNN on the same keyed images (``[0, 1]`` pixels, 10 classes, batches
gathered on the device by ``TensorLoader``) with SGD and momentum, under the same precision and memory
format:

- the hand-written loop: ``torch.compile(model)`` in channels-last, ``torch.autocast``, ``torch.optim.SGD``
  (foreach), ``zero_grad`` / ``backward`` / ``step``: what a user writes without a framework;
- ``composer_fn.Trainer(compile=True)`` with ``ChannelsLast`` (the whole step, update included, is one
  compiled graph), then the same with each data algorithm added.

Per-step time is the median epoch time over the steps of an epoch, after a first epoch that compiles; the
device is synchronised at every epoch boundary. Contenders run one after another, each on a fresh model.

    python benchmarks/gpu_step.py [--device cuda] [--precision bf16-mixed] [--width 64] [--batch 256]
        [--epochs 6] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from composer_fn import optim
from composer_fn.algorithms import ChannelsLast, CutMix, CutOut, LabelSmoothing, MixUp, RandAugment
from composer_fn.callbacks.base import Callback, RunView
from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm
from composer_fn.data import TensorLoader
from composer_fn.models import SmallCNN
from composer_fn.trainer import Trainer

SAMPLES = 8192
NUM_CLASSES = 10

HAND = "hand"
LABELS: dict[str, str] = {
    HAND: "hand loop, torch.compile(model)",
    "trainer": "Trainer",
    "mixup": "Trainer + MixUp",
    "mixup_per_sample": "Trainer + MixUp, per sample",
    "cutmix": "Trainer + CutMix",
    "cutout": "Trainer + CutOut",
    "label_smoothing": "Trainer + LabelSmoothing",
    "randaugment": "Trainer + RandAugment",
}
ALGORITHMS: dict[str, tuple[Algorithm, ...]] = {
    "trainer": (),
    "mixup": (MixUp(),),
    "mixup_per_sample": (MixUp(per_sample=True),),
    "cutmix": (CutMix(),),
    "cutout": (CutOut(),),
    "label_smoothing": (LabelSmoothing(),),
    "randaugment": (RandAugment(),),
}


class EpochClock(Callback):
    """Records the wall time of every epoch, synchronising the device at both ends."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: list[float] = []
        self._start = 0.0

    def epoch_start(self, view: RunView) -> None:
        _synchronize(self.device)
        self._start = time.perf_counter()

    def epoch_end(self, view: RunView) -> None:
        _synchronize(self.device)
        self.seconds.append(time.perf_counter() - self._start)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def data(device: torch.device, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns keyed images in [0, 1] and labels on ``device``."""
    images = R.uniform(R.key(0), (SAMPLES, 3, size, size)).to(device)
    labels = R.randint(R.key(1), 0, NUM_CLASSES, (SAMPLES,)).to(device)
    return images, labels


def hand_loop(args: argparse.Namespace, tensors: tuple[torch.Tensor, ...], device: torch.device) -> list[float]:
    """Returns the epoch times of the hand-written compiled loop."""
    model = SmallCNN(3, NUM_CLASSES, width=args.width).to(device, memory_format=torch.channels_last)
    compiled: Callable[..., Any] = torch.compile(model)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    loader = TensorLoader(tensors, args.batch, seed=0, drop_last=True)
    dtype = torch.bfloat16 if args.precision == "bf16-mixed" else None
    seconds = []
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        _synchronize(device)
        start = time.perf_counter()
        for images, labels in loader:
            images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = F.cross_entropy(compiled(images), labels)
            sgd.zero_grad(set_to_none=True)
            loss.backward()
            sgd.step()
        _synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def trainer_run(
    args: argparse.Namespace, tensors: tuple[torch.Tensor, ...], device: torch.device, algorithms: tuple[Algorithm, ...]
) -> tuple[list[float], int]:
    """Returns the epoch times of the compiled Trainer and how many graphs it compiled."""
    clock = EpochClock(device)
    trainer = Trainer(
        SmallCNN(3, NUM_CLASSES, width=args.width),
        TensorLoader(tensors, args.batch, seed=0, drop_last=True),
        max_duration=f"{args.epochs}ep",
        optimizer=optim.sgd(0.1, momentum=0.9),
        algorithms=(ChannelsLast(), *algorithms),
        precision=args.precision,
        compile=True,
        device=device,
        callbacks=[clock],
        progress_bar=False,
        log_interval=f"{args.epochs}ep",
    )
    trainer.fit()
    return clock.seconds, trainer.compiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="bf16-mixed", choices=("fp32", "bf16-mixed"))
    parser.add_argument("--width", type=int, default=64, help="SmallCNN width (default 64)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=32, help="image side (default 32)")
    parser.add_argument("--epochs", type=int, default=6, help="epochs per contender, the first one compiles")
    parser.add_argument("--only", default=None, help=f"comma-separated contenders among {', '.join(LABELS)}")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error(f"--epochs={args.epochs}: at least 2 (the first one compiles)")
    names = [HAND, *ALGORITHMS]
    if args.only:
        chosen = [name.strip() for name in args.only.split(",")]
        unknown = [name for name in chosen if name not in names]
        if unknown:
            parser.error(f"--only names {unknown}; known: {names}")
        names = [name for name in names if name in chosen]
    device = torch.device(args.device)
    tensors = data(device, args.size)
    steps = SAMPLES // args.batch
    rows = []
    for name in names:
        compiles = "-"
        if name == HAND:
            seconds = hand_loop(args, tensors, device)
        else:
            seconds, count = trainer_run(args, tensors, device, ALGORITHMS[name])
            compiles = str(count)
        steady = statistics.median(seconds[1:]) / steps
        rows.append((name, seconds[0], steady, compiles))
        print(f"{LABELS[name]}: first epoch {seconds[0]:.1f} s, {steady * 1e3:.3f} ms/step", flush=True)
    hand = next((steady for name, _, steady, _ in rows if name == HAND), None)
    title = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"\nSmallCNN(width={args.width}), batch {args.batch}x3x{args.size}x{args.size}, {args.precision}, "
        f"channels-last, compiled, {title}, torch {torch.__version__}; median of {args.epochs - 1} epochs "
        f"of {steps} steps"
    )
    print(f"{'contender':<34} {'first epoch s':>13} {'ms/step':>8} {'× hand':>7} {'graphs':>6}")
    for name, first, steady, compiles in rows:
        ratio = f"{steady / hand:.2f}×" if hand else "-"
        print(f"{LABELS[name]:<34} {first:>13.1f} {steady * 1e3:>8.3f} {ratio:>7} {compiles:>6}")


if __name__ == "__main__":
    main()
