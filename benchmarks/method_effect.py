"""Measures each algorithm's effect on the digits task: held-out accuracy and wall time, mean over seeds.

Usage: python benchmarks/method_effect.py [--seeds 3] [--epochs 12] [--threads 2] [--only NAME,...] [--json PATH]
    [--upsample 4] [--device cuda] [--precision bf16-mixed] [--compile] [--algorithm CONFIG ...]
``--algorithm`` adds a configuration given as an algorithm's JSON config (``Algorithm.to_config()``, e.g.
``'{"algorithm": "blurpool", "hparams": {}}'``), compared with the baseline; with ``--algorithm`` and no
``--only``, only the baseline and the given configurations run.
Every configuration trains the same SmallCNN recipe (SGD, Nesterov momentum, cosine with one warm-up epoch)
from the same seeds; only the algorithms differ, each with Composer's default hyperparameters except where
CONFIGURATIONS gives others (EMA's half-life is 50 batches, a fifth of the run: Composer's 1000 exceeds it;
GradientClipping clips the global norm at 1.0, as Composer's defaults are required arguments). Runs are
interleaved seed by seed.

RandAugment and AugMix take pixels in [0, 1] (as they do in a data pipeline, before normalisation), so they
and a baseline of their own train on the unstandardised pixels (``load_digits_task(standardize=False)``);
every other configuration trains on the standardised ones. Each row's "vs base" compares with the baseline
of its own pixel form.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from _recipe import train_digits

from composer_fn.algorithms import (
    EMA,
    SAM,
    SWA,
    AugMix,
    ChannelsLast,
    ColOut,
    CutMix,
    CutOut,
    GradientClipping,
    LabelSmoothing,
    LayerFreezing,
    MixUp,
    ProgressiveResizing,
    RandAugment,
    RandomCropFlip,
    SelectiveBackprop,
)
from composer_fn.core.algorithm import Algorithm, algorithm_from_config
from composer_fn.data import load_digits_task
from composer_fn.models import SmallCNN

RAW = "[0,1] pixels"
"""The suffix of configurations trained on unstandardised pixels."""

CONFIGURATIONS: dict[str, tuple[Algorithm, ...]] = {
    "baseline": (),
    "mixup": (MixUp(alpha=0.2),),
    "mixup, per sample": (MixUp(alpha=0.2, per_sample=True),),
    "label_smoothing": (LabelSmoothing(0.1),),
    "channels_last": (ChannelsLast(),),
    "cutmix": (CutMix(),),
    "cutmix, per sample": (CutMix(per_sample=True),),
    "cutout": (CutOut(),),
    "cutout, per sample": (CutOut(per_sample=True),),
    "colout": (ColOut(),),
    "random_crop_flip": (RandomCropFlip(padding=1, flip_p=0.0),),
    "progressive_resizing": (ProgressiveResizing(),),
    "selective_backprop": (SelectiveBackprop(),),
    "gradient_clipping": (GradientClipping(clipping_type="norm", clipping_threshold=1.0),),
    "sam": (SAM(),),
    "ema": (EMA(half_life="50ba"),),
    "swa": (SWA(),),
    "layer_freezing": (LayerFreezing(),),
    "mixup+label_smoothing+channels_last": (MixUp(alpha=0.2), LabelSmoothing(0.1), ChannelsLast()),
    f"baseline, {RAW}": (),
    f"randaugment, {RAW}": (RandAugment(),),
    f"augmix, {RAW}": (AugMix(),),
}


def baseline_of(name: str) -> str:
    """Returns the baseline configuration that ``name`` is compared with (the one of its pixel form)."""
    return f"baseline, {RAW}" if name.endswith(RAW) else "baseline"


def run(name: str, seed: int, args: argparse.Namespace) -> tuple[float, float]:
    """Returns (held-out accuracy, training wall seconds) of one run of configuration ``name``."""
    task = load_digits_task(upsample=args.upsample, standardize=not name.endswith(RAW))
    return train_digits(
        SmallCNN(in_channels=1, num_classes=10),
        task,
        CONFIGURATIONS[name],
        seed,
        args.epochs,
        device=args.device,
        precision=args.precision,
        compile=args.compile,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default=None, help="comma-separated configurations (their baselines run too)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--upsample", type=int, default=1, help="image side 8 x this (bilinear), default 1")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16-mixed"))
    parser.add_argument("--compile", action="store_true", help="compile each step with torch.compile (inductor)")
    parser.add_argument("--algorithm", action="append", default=[], help="an algorithm's JSON config (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    given = [algorithm_from_config(json.loads(config)) for config in args.algorithm]
    CONFIGURATIONS.update({repr(algorithm): (algorithm,) for algorithm in given})
    names = ["baseline", *(repr(a) for a in given)] if given and not args.only else list(CONFIGURATIONS)
    if args.only:
        chosen = [name.strip() for name in args.only.split(",")]
        unknown = [name for name in chosen if name not in CONFIGURATIONS]
        if unknown:
            parser.error(f"--only names {unknown}; known: {', '.join(CONFIGURATIONS)}")
        names = [n for n in CONFIGURATIONS if n in chosen or n in {baseline_of(c) for c in chosen}]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for seed in range(args.seeds):
        for name in names:
            results[name].append(run(name, seed, args))
    side = 8 * args.upsample
    print(
        f"digits {side}x{side}, SmallCNN, {args.epochs} epochs, seeds 0..{args.seeds - 1}, {args.device}, "
        f"{args.precision}{', compiled' if args.compile else ''}, {args.threads} threads"
    )
    print(
        f"{'configuration':<38} {'accuracy mean':>13} {'min':>7} {'max':>7} {'Δ mean':>7} {'time s':>7} {'vs base':>7}"
    )
    for name, runs in results.items():
        base = results[baseline_of(name)]
        accuracies = [a for a, _ in runs]
        seconds = statistics.mean(t for _, t in runs)
        delta = statistics.mean(accuracies) - statistics.mean(a for a, _ in base)
        print(
            f"{name:<38} {statistics.mean(accuracies):>13.2%} {min(accuracies):>7.2%} {max(accuracies):>7.2%} "
            f"{delta * 100:>+6.2f}p {seconds:>7.2f} {seconds / statistics.mean(t for _, t in base):>6.2f}x"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump({name: [list(r) for r in runs] for name, runs in results.items()}, stream, indent=2)


if __name__ == "__main__":
    main()
