"""The differential suite's table: the Trainer against a hand-written torch.optim loop, per model and path.

For each torchvision architecture at a small size (``composer_fn.testing.differential.torchvision_models``)
and each optimizer (SGD with momentum, AdamW), trains ``--steps`` steps of batches of ``--batch-size`` random
images along each path (eager, compiled with aot_eager, microbatched, ChannelsLast) next to its torch
reference, and prints each path's worst relative update error ``‖ours − torch‖ / ‖torch − initial‖`` over
the model's parameters, then over those whose update torch's own fp32 loop computes within 1e-3 of float64
(the others move by rounding noise: a bias before a normalization has a zero gradient but for rounding), with
``!`` where a parameter is off by more than its allowance (the tolerance plus
ten times torch's own fp32-against-float64 error there). The same comparison runs in the test suite
(``tests/trainer/test_differential.py``).

    .venv/bin/python benchmarks/differential.py [--models resnet18,convnext_tiny] [--paths eager,compiled]
        [--steps 3] [--batch-size 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import torch
from _peer import format_table, pin_threads

from composer_fn.testing.differential import ADAMW, PATHS, SGD_MOMENTUM, compare, torchvision_models


def main(argv: Sequence[str] | None = None) -> None:
    models = torchvision_models()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(models), help="comma-separated model names")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated paths")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    names, paths = args.models.split(","), args.paths.split(",")
    for name in names:
        if name not in models:
            parser.error(f"--models: unknown model {name!r}; expected some of {', '.join(models)}")
    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}, {args.threads} thread(s); "
        f"{args.steps} steps of {args.batch_size} images; worst relative update error over each model's "
        "parameters / among those torch's fp32 loop computes within 1e-3 of float64 ('!': over its allowance)"
    )
    rows = []
    failed = 0
    for name in names:
        for optimizer in (SGD_MOMENTUM, ADAMW):
            start = time.perf_counter()
            comparisons = compare(models[name], optimizer, paths, steps=args.steps, batch_size=args.batch_size)
            cells = []
            for comparison in comparisons:
                _, error = comparison.worst
                _, determined = comparison.worst_determined()
                shown = "—" if determined != determined else f"{determined:.1e}"
                cells.append(f"{error:.1e} / {shown}{' !' if comparison.failures else ''}")
                failed += bool(comparison.failures)
            parameters = sum(p.numel() for p in models[name].build().parameters())
            rows.append([name, f"{parameters / 1e3:.0f}k", optimizer.name, *cells, f"{time.perf_counter() - start:.1f}"])
    print(format_table(["model", "params", "optimizer", *paths, "s"], rows))
    print(f"{failed} path(s) over their allowance")


if __name__ == "__main__":
    main()
