"""Batch-transform ops on the CPU: ours next to torchvision.transforms.v2, timm and composer.functional.

Two batch shapes, float32 images in [0, 1] and 10 classes: B=256x3x32x32 and B=64x3x224x224. Every op is timed
as one call on the whole batch (median of ``--reps`` calls, after one warm-up call), in ``--rounds`` rounds that
alternate ours and the peer interpreter (timm and Composer live in the peer environment built by
``../shared/tools/peer-env.sh``; torchvision is ours and the peer's, the same version). Every contender's figure
is its best round: on a shared machine, outside load only ever slows a round down, and it strikes the
contenders at different moments.

- The memory floor is ``torch.lerp(x, x[perm], λ)`` on the same tensor: one gather and one blend, what any
  mixing op must at least do.
- Ours are the notebook functions with their key (``mixup_batch(x, y, key=...)`` …): the keyed draws, the
  transform and the finished targets, all in the timed call. Composer's return permuted targets and leave the
  mixing to the caller, so they do less work per call.
- timm's ``Mixup`` and ``RandomErasing`` work in place: each call gets a fresh copy of the batch and the copy's
  own time is subtracted. ``mode='elem'`` is timm's per-sample mode (a Python loop over samples).
- RandAugment and AugMix: ours transform the whole batch at once (uint8 and float32); Composer's, timm's and
  torchvision's transform one image at a time (PIL images for Composer and timm, uint8 tensors for
  torchvision), timed over 64 images; the table reports images per second.

Targets: mixup, cutmix and cutout in batch mode within 1.5x the floor; per-sample modes within 2x their batch
mode; batched RandAugment at 32x32 at least 5x the images/s of Composer's per-image path and faster than
torchvision v2 applied per image.

    .venv/bin/python benchmarks/ops.py [--threads 1] [--rounds 3] [--reps 15] [--json out.json] [--no-peer]
        [--device cuda] [--dtype bfloat16]

``--device cuda`` runs ours, the floor and torchvision on the GPU (synchronising around every timed call; our
keys stay on the host, as in a notebook);
the peer interpreter stays on the CPU, so its columns are left out there. ``--dtype`` sets the float images'
dtype (float32 by default; the uint8 rows stay uint8).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchvision.transforms.v2 as v2
from _peer import (
    PEER_ENV_SCRIPT,
    Peer,
    PeerError,
    add_common_arguments,
    environment,
    find_peer_python,
    format_table,
    pin_threads,
    write_json,
)

from composer_fn.core import random as R
from composer_fn.functional import (
    augmix_batch,
    colout_batch,
    cutmix_batch,
    cutout_batch,
    mixup_batch,
    randaugment_batch,
    resize_batch,
    smooth_labels,
)

SHAPES: tuple[tuple[int, int], ...] = ((256, 32), (64, 224))
PER_IMAGE_COUNT = 64
NUM_CLASSES = 10

PEER_SOURCE = (Path(__file__).with_name("_peer_ops.py")).read_text(encoding="utf-8")

# (row label, our op key, peer op keys by column)
ROWS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("floor: lerp(x, x[perm], λ)", "floor", {}),
    ("mixup, batch", "mixup", {"composer": "composer.mixup_batch", "timm": "timm.mixup", "torchvision": "tv.mixup"}),
    ("mixup, per sample", "mixup_per_sample", {"timm": "timm.mixup_elem"}),
    ("cutmix, batch", "cutmix", {"composer": "composer.cutmix_batch", "timm": "timm.cutmix", "torchvision": "tv.cutmix"}),
    ("cutmix, per sample", "cutmix_per_sample", {"timm": "timm.cutmix_elem"}),
    ("cutout, batch", "cutout", {"composer": "composer.cutout_batch", "torchvision": "tv.random_erasing"}),
    ("cutout, per sample", "cutout_per_sample", {"timm": "timm.random_erasing"}),
    ("colout", "colout", {"composer": "composer.colout_batch"}),
    ("resize to 0.5 (progressive resizing)", "resize", {"composer": "composer.resize_batch"}),
    ("smooth_labels", "smooth_labels", {"composer": "composer.smooth_labels"}),
)
IMAGE_ROWS: tuple[tuple[str, str, dict[str, str]], ...] = (
    (
        "randaugment (severity 9, depth 2)",
        "randaugment",
        {"composer": "composer.randaugment_image", "timm": "timm.rand_augment", "torchvision": "tv.randaugment"},
    ),
    (
        "augmix (severity 3, width 3)",
        "augmix",
        {"composer": "composer.augmix_image", "timm": "timm.augmix", "torchvision": "tv.augmix"},
    ),
)
COLUMNS = ("composer", "timm", "torchvision")


DEVICE = torch.device("cpu")
"""Where ours, the floor and torchvision run (``--device``)."""


def batch(size: int, side: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns images in [0, 1] of ``dtype`` and class labels on ``DEVICE``, drawn from a fixed key."""
    images = R.uniform(R.key(0), (size, 3, side, side)).to(DEVICE, dtype)
    labels = R.randint(R.key(1), 0, NUM_CLASSES, (size,)).to(DEVICE)
    return images, labels


def _synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def timed(fn: Callable[[], Any], reps: int) -> float:
    """Returns the median seconds of ``reps`` calls of ``fn`` after one warm-up call (device work included)."""
    fn()
    seconds = []
    for _ in range(reps):
        _synchronize()
        start = time.perf_counter()
        fn()
        _synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def our_op(name: str, x: torch.Tensor, y: torch.Tensor) -> Callable[[], Any]:
    """Returns a zero-argument call of our op ``name`` on the batch (a fresh key each call)."""
    counter = iter(range(10**9))
    perm = R.permutation(R.key(2), x.shape[0]).to(x.device)
    uint8 = (x.float() * 255).round().to(torch.uint8)
    logits = torch.zeros(x.shape[0], NUM_CLASSES, device=x.device)

    def key() -> torch.Tensor:
        # A notebook's key: made on the host, whatever the device of the batch (host-side draws read it
        # without a device sync).
        return R.key(next(counter))

    ops: dict[str, Callable[[], Any]] = {
        "floor": lambda: torch.lerp(x, x[perm], 0.3),
        "mixup": lambda: mixup_batch(x, y, alpha=0.2, key=key(), num_classes=NUM_CLASSES),
        "mixup_per_sample": lambda: mixup_batch(x, y, alpha=0.2, key=key(), num_classes=NUM_CLASSES, per_sample=True),
        "cutmix": lambda: cutmix_batch(x, y, alpha=1.0, key=key(), num_classes=NUM_CLASSES),
        "cutmix_per_sample": lambda: cutmix_batch(x, y, alpha=1.0, key=key(), num_classes=NUM_CLASSES, per_sample=True),
        "cutout": lambda: cutout_batch(x, num_holes=1, length=0.5, key=key()),
        "cutout_per_sample": lambda: cutout_batch(x, num_holes=1, length=0.5, key=key(), per_sample=True),
        "colout": lambda: colout_batch(x, p_row=0.15, p_col=0.15, key=key()),
        "resize": lambda: resize_batch(x, y, 0.5, "resize"),
        "smooth_labels": lambda: smooth_labels(logits, y, 0.1),
        "randaugment": lambda: randaugment_batch(x, severity=9, depth=2, key=key()),
        "randaugment_uint8": lambda: randaugment_batch(uint8, severity=9, depth=2, key=key()),
        "augmix": lambda: augmix_batch(x, severity=3, depth=-1, width=3, alpha=1.0, key=key()),
        "augmix_uint8": lambda: augmix_batch(uint8, severity=3, depth=-1, width=3, alpha=1.0, key=key()),
    }
    return ops[name]


def torchvision_op(name: str, x: torch.Tensor, y: torch.Tensor) -> tuple[Callable[[], Any], int]:
    """Returns a call of torchvision v2's op and how many images one call transforms."""
    uint8 = (x[:PER_IMAGE_COUNT].float() * 255).round().to(torch.uint8)
    if name == "tv.mixup":
        mix = v2.MixUp(alpha=0.2, num_classes=NUM_CLASSES)
        return (lambda: mix(x, y)), x.shape[0]
    if name == "tv.cutmix":
        cut = v2.CutMix(alpha=1.0, num_classes=NUM_CLASSES)
        return (lambda: cut(x, y)), x.shape[0]
    if name == "tv.random_erasing":
        # One box for the batch, like cutout's batch mode (a batched tensor is erased as one image).
        erase = v2.RandomErasing(p=1.0, value=0)
        return (lambda: erase(x)), x.shape[0]
    transform = {"tv.randaugment": v2.RandAugment(num_ops=2, magnitude=9), "tv.augmix": v2.AugMix(severity=3)}[name]
    images = list(uint8)
    return (lambda: [transform(image) for image in images]), len(images)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Returns every figure (seconds per call, per image for per-image rows) after printing the tables."""
    global DEVICE
    DEVICE = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    pin_threads(args.threads)
    torch.manual_seed(0)  # torchvision's transforms draw from the global generator; ours never read it
    peer: Peer | None = None
    python = None if args.no_peer or DEVICE.type != "cpu" else find_peer_python(args.peer_python)
    peer_note = ""
    if args.no_peer:
        peer_note = "timm and composer columns skipped (--no-peer)"
    elif DEVICE.type != "cpu":
        peer_note = f"timm and composer columns skipped: they run on the CPU, ours on {DEVICE}"
    elif python is None:
        peer_note = f"timm and composer columns skipped: no peer environment (build it with bash {PEER_ENV_SCRIPT})"
    else:
        peer = Peer(python, PEER_SOURCE, threads=args.threads, timeout=600).start()

    samples: dict[tuple[str, int, int], list[float]] = {}

    def record(key: tuple[str, int, int], seconds: float) -> None:
        samples.setdefault(key, []).append(seconds)

    data = {shape: batch(*shape, dtype=dtype) for shape in SHAPES}
    peer_info: Any = None
    for round_index in range(args.rounds):
        if sys.stderr.isatty():
            print(f"round {round_index + 1}/{args.rounds}", end="\r", file=sys.stderr, flush=True)
        for size, side in SHAPES:
            x, y = data[(size, side)]
            reps = args.reps if side <= 32 else max(args.reps // 3, 3)
            for _, op, columns in ROWS + IMAGE_ROWS:
                ops = [op, f"{op}_uint8"] if op in ("randaugment", "augmix") else [op]
                for name in ops:
                    record((name, size, side), timed(our_op(name, x, y), reps))
                tv = columns.get("torchvision")
                if tv is not None:
                    call, count = torchvision_op(tv, x, y)
                    record((tv, size, side), timed(call, max(reps // 3, 2)) / (count if op in ("randaugment", "augmix") else 1))
            if peer is not None:
                try:
                    peer_info = peer.wait_ready()
                    for _, _, columns in ROWS + IMAGE_ROWS:
                        for column in ("composer", "timm"):
                            name = columns.get(column)
                            if name is not None:
                                record((name, size, side), peer.call("measure", op=name, batch=size, size=side, reps=reps))
                except PeerError as error:
                    peer_note = f"timm and composer columns skipped: {error}"
                    peer.close()
                    peer = None
    if peer is not None:
        peer.close()

    # Each round's median, the best round of each contender.
    seconds = {f"{name}@{size}x{side}": min(values) for (name, size, side), values in samples.items()}
    print_report(seconds, peer_note, args)
    return {"seconds": seconds, "peer": peer_info, "peer_note": peer_note}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def print_report(seconds: dict[str, float], peer_note: str, args: argparse.Namespace) -> None:
    """Prints one table per shape and the targets."""
    for size, side in SHAPES:
        at = f"@{size}x{side}"
        floor = seconds[f"floor{at}"]
        rows = []
        for label, op, columns in ROWS:
            ours = seconds[f"{op}{at}"]
            peers = [_ms(seconds.get(f"{columns[c]}{at}")) if c in columns else "" for c in COLUMNS]
            rows.append((label, _ms(ours), f"{ours / floor:.2f}x", *peers))
        print(
            f"\nbatch ops on {args.device}, B={size}x3x{side}x{side} {args.dtype}, ms per call "
            f"(best of {args.rounds} rounds)"
        )
        print(format_table(("op", "ours", "ours/floor", *COLUMNS), rows))
        image_rows = []
        for label, op, columns in IMAGE_ROWS:
            for suffix, dtype in (("", args.dtype), ("_uint8", "uint8")):
                ours = seconds[f"{op}{suffix}{at}"]
                peers = [
                    f"{1 / seconds[f'{columns[c]}{at}']:,.0f}" if f"{columns[c]}{at}" in seconds else "-" for c in COLUMNS
                ]
                image_rows.append((f"{label}, {dtype}", f"{size / ours:,.0f}", *peers))
        print(
            f"\nimages per second on {args.device}, B={size}x3x{side}x{side} "
            "(ours: the whole batch at once; peers: one image at a time)"
        )
        print(format_table(("op", "ours", *COLUMNS), image_rows))
        print("\ntargets at this shape:")
        for op in ("mixup", "cutmix", "cutout"):
            ratio = seconds[f"{op}{at}"] / floor
            per_sample = seconds[f"{op}_per_sample{at}"] / seconds[f"{op}{at}"]
            print(
                f"  {op:<7} batch/floor {ratio:.2f}x (target <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'}); "
                f"per-sample/batch {per_sample:.2f}x (target <= 2x: {'met' if per_sample <= 2 else 'NOT met'})"
            )
        ours_rate = size / seconds[f"randaugment_uint8{at}"]
        composer = seconds.get(f"composer.randaugment_image{at}")
        torchvision = seconds.get(f"tv.randaugment{at}")
        if composer is not None:
            speedup = ours_rate * composer
            target = " (target >= 5x at 32x32: " + ("met)" if speedup >= 5 else "NOT met)") if side == 32 else ""
            print(f"  randaugment uint8: {speedup:.1f}x Composer's per-image images/s{target}")
        if torchvision is not None:
            print(f"  randaugment uint8: {ours_rate * torchvision:.1f}x torchvision v2 per image")
    if peer_note:
        print(f"\n{peer_note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--reps", type=int, default=15, help="calls per measurement at 32x32 (224x224: a third)")
    parser.add_argument("--device", default="cpu", help="where ours, the floor and torchvision run (default cpu)")
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="the float images' dtype"
    )
    args = parser.parse_args()
    result = run(args)
    if args.json is not None:
        write_json(args.json, {"environment": environment(args.threads), **result})


if __name__ == "__main__":
    main()
