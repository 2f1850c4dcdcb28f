"""Measures language-model algorithms on the standard-library character task: held-out loss, bits per character, time.

Usage: python benchmarks/lm_effect.py [--seeds 3] [--steps 180] [--seq-len 128] [--threads 1] [--json PATH]
    [--precision bf16-mixed] [--algorithm CONFIG ...]
Without ``--algorithm`` it compares SeqLengthWarmup with the baseline (see ``configurations``). ``--algorithm``
adds a configuration given as an algorithm's JSON config (``Algorithm.to_config()``, e.g.
``'{"algorithm": "alibi", "hparams": {"max_sequence_length": 128}}'``); with it, only the baseline and the given
configurations run. ``--precision`` applies to every configuration, the baseline included.
Every configuration trains the same CausalLM recipe (AdamW, cosine schedule with a warm-up) for the same number
of optimizer steps from the same seeds; only the algorithms differ. Held-out loss is the mean next-character
cross-entropy over every position of every held-out row at the full sequence length; bits per character is
that loss divided by ln 2. Runs are interleaved seed by seed. One intra-op thread by default, as in the other
benchmarks: on a shared 2-core machine two threads make step times swing several-fold. The load average is
printed before and after, to judge how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch

import composer_fn.algorithms  # noqa: F401  (registers every algorithm, for --algorithm)
from composer_fn import optim
from composer_fn.algorithms.seq_length_warmup import SeqLengthWarmup
from composer_fn.core.algorithm import Algorithm, algorithm_from_config
from composer_fn.core.random import key
from composer_fn.core.state import Precision
from composer_fn.core.time import Timestamp
from composer_fn.data.text import load_stdlib_text_task
from composer_fn.models.lm import CausalLM, causal_lm_loss
from composer_fn.nn import init_parameters
from composer_fn.trainer import Trainer

BATCH_SIZE = 32


def warmup(seq_len: int, truncate: bool = True) -> SeqLengthWarmup:
    """Returns the warm-up compared here: Composer's defaults with the task's length as the maximum."""
    return SeqLengthWarmup(
        duration=0.3, min_seq_length=8, max_seq_length=seq_len, step_size=8, truncate=truncate
    )


def tokens_trained(algorithms: tuple[Algorithm, ...], steps: int, seq_len: int) -> int:
    """Returns how many tokens the model is trained on over ``steps`` steps (after any shortening)."""
    timestamp = Timestamp().with_max_duration(f"{steps}ba")
    total = 0
    for _ in range(steps):
        length, truncate = seq_len, True
        for algorithm in algorithms:
            if isinstance(algorithm, SeqLengthWarmup):
                length, truncate = min(length, algorithm.sequence_length(timestamp)), algorithm.truncate
        tokens = BATCH_SIZE * seq_len
        total += BATCH_SIZE * length if truncate else tokens // length * length
        timestamp = timestamp.advance(BATCH_SIZE)
    return total


def configurations(steps: int, seq_len: int) -> dict[str, tuple[tuple[Algorithm, ...], int]]:
    """Returns the compared runs by name: the algorithms and the number of optimizer steps."""
    warmed = (warmup(seq_len),)
    # The baseline again, cut to the number of full-length steps that holds as many tokens as the warm-up run.
    matched = round(tokens_trained(warmed, steps, seq_len) / (BATCH_SIZE * seq_len))
    return {
        "baseline": ((), steps),
        "seq_length_warmup": (warmed, steps),
        "seq_length_warmup (reshape)": ((warmup(seq_len, truncate=False),), steps),
        f"baseline, {matched} steps (same tokens)": ((), matched),
    }


def run(
    algorithms: tuple[Algorithm, ...], seed: int, steps: int, seq_len: int, precision: Precision = "fp32"
) -> tuple[float, float, float]:
    """Returns (held-out loss, training wall seconds, training CPU seconds) of one run."""
    task = load_stdlib_text_task(seq_len=seq_len, batch_size=BATCH_SIZE, max_chars=200_000, seed=seed)
    model = CausalLM(task.vocab_size, d_model=64, n_heads=4, n_layers=2, max_seq_len=seq_len)
    model.load_state_dict(init_parameters(model, key(seed)), strict=False)
    trainer = Trainer(
        model,
        task.train,
        task.eval,
        max_duration=f"{steps}ba",
        optimizer=optim.adamw(3e-3, weight_decay=0.01),
        schedule=optim.CosineAnnealingWithWarmupScheduler(t_warmup=f"{max(steps // 20, 1)}ba"),
        algorithms=algorithms,
        seed=seed,
        loss_fn=causal_lm_loss(),
        input_key=0,
        target_key=1,
        eval_interval=f"{steps}ba",
        progress_bar=False,
        precision=precision,
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    metrics = trainer.fit()
    return metrics["eval/eval/loss"], time.perf_counter() - started, time.process_time() - cpu_started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=180)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16-mixed"))
    parser.add_argument(
        "--algorithm", action="append", default=[], help="an algorithm's JSON config (repeatable)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    given = [algorithm_from_config(json.loads(config)) for config in args.algorithm]
    if given:
        compared = {"baseline": ((), args.steps), **{repr(a): ((a,), args.steps) for a in given}}
    else:
        compared = configurations(args.steps, args.seq_len)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in compared}
    load_before = os.getloadavg()[0]
    for seed in range(args.seeds):
        for name, (algorithms, steps) in compared.items():
            results[name].append(run(algorithms, seed, steps, args.seq_len, args.precision))
    baseline_time = statistics.mean(t for _, t, _ in results["baseline"])
    print(
        f"stdlib characters, CausalLM d64 x2, batch {BATCH_SIZE} x {args.seq_len}, AdamW 3e-3 cosine, "
        f"seeds 0..{args.seeds - 1}, {args.precision}, {args.threads} thread(s), load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after"
    )
    header = (
        "configuration",
        "steps",
        "tokens",
        "eval loss",
        "min",
        "max",
        "bpc",
        "wall s",
        "vs base",
        "cpu s",
    )
    width = max(38, *(len(name) for name in results))
    print(f"{header[0]:<{width}} {header[1]:>5} {header[2]:>9} " + " ".join(f"{h:>9}" for h in header[3:]))
    for name, runs in results.items():
        algorithms, steps = compared[name]
        losses = [loss for loss, _, _ in runs]
        wall = statistics.mean(t for _, t, _ in runs)
        cpu = statistics.mean(c for _, _, c in runs)
        mean_loss = statistics.mean(losses)
        print(
            f"{name:<{width}} {steps:>5} {tokens_trained(algorithms, steps, args.seq_len):>9,} {mean_loss:>9.4f} "
            f"{min(losses):>9.4f} {max(losses):>9.4f} {mean_loss / math.log(2):>9.3f} {wall:>9.2f} "
            f"{wall / baseline_time:>8.2f}x {cpu:>9.2f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump({name: [list(r) for r in runs] for name, runs in results.items()}, stream, indent=2)


if __name__ == "__main__":
    main()
