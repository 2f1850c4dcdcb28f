"""Step time with the monitors, loggers and progress bar on, against a run with none, in the same process run.

Usage: python benchmarks/callbacks.py [--rounds 5] [--threads 1]

"on" is a Trainer with ``SpeedMonitor``, ``LRMonitor``, ``MemoryMonitor`` and ``RuntimeEstimator``, the
console, TensorBoard and JSON-lines loggers at the default ``log_interval`` (50 batches), and the progress bar
(written to /dev/null); "off" has none of them; "on, every 10ba" is "on" logging every 10 batches.
``SystemMetricsMonitor`` (it reads the operating system's disk and network counters), ``NaNMonitor`` (it reads
every parameter at every step) and ``OptimizerMonitor`` (the step computes gradient and update norms) are timed
alone, in columns of their own. Per-step time is marginal: (t(long run) − t(short run)) / the steps between,
each run on a fresh Trainer, so start-up cancels; rounds rotate the order.

Target (printed): "on" ≤ 1.03× "off" on the tiny MLP and the digits CNN, at the default interval.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _peer import format_table, pin_threads
from step_overhead import LEARNING_RATE, MOMENTUM, Task, cnn_task, mlp_task

from composer_fn import Trainer
from composer_fn.callbacks import (
    LRMonitor,
    MemoryMonitor,
    NaNMonitor,
    OptimizerMonitor,
    RuntimeEstimator,
    SpeedMonitor,
    SystemMetricsMonitor,
)
from composer_fn.loggers import ConsoleLogger, JSONLLogger, TensorBoardLogger
from composer_fn.optim import sgd


def _options(config: str, folder: Path, sink: Any) -> dict[str, Any]:
    if config == "off":
        return {}
    if config == "SystemMetricsMonitor":
        return {"callbacks": [SystemMetricsMonitor()]}
    if config == "NaNMonitor":
        return {"callbacks": [NaNMonitor()]}
    if config == "OptimizerMonitor":
        return {"callbacks": [OptimizerMonitor()]}
    monitors = [SpeedMonitor(), LRMonitor(), MemoryMonitor(), RuntimeEstimator()]
    options = {
        "callbacks": monitors,
        "loggers": [ConsoleLogger(sink), TensorBoardLogger(folder / "tb"), JSONLLogger(folder / "log.jsonl")],
        "progress_bar": True,
    }
    return {**options, "log_interval": "10ba"} if config == "on, every 10ba" else options


def _seconds(task: Task, epochs: int, config: str, sink: Any) -> float:
    with tempfile.TemporaryDirectory() as folder:
        options = {"progress_bar": False, **_options(config, Path(folder), sink)}
        trainer = Trainer(
            task.build(),
            task.loader(),
            max_duration=f"{epochs}ep",
            optimizer=sgd(LEARNING_RATE, momentum=MOMENTUM),
            device="cpu",
            **options,
        )
        with contextlib.redirect_stderr(sink):
            began = time.perf_counter()
            trainer.fit()
            return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    pin_threads(args.threads)
    configs = ("off", "on", "on, every 10ba", "SystemMetricsMonitor", "NaNMonitor", "OptimizerMonitor")
    rows = []
    worst = 0.0
    with open(os.devnull, "w") as sink:
        for task in (mlp_task(), cnn_task()):
            for config in configs:  # warm-up: first-call caches, the digits file
                _seconds(task, task.short, config, sink)
            samples: dict[str, list[float]] = {config: [] for config in configs}
            for index in range(args.rounds):
                order = configs[index % len(configs) :] + configs[: index % len(configs)]
                for config in order:
                    long = _seconds(task, task.long, config, sink)
                    short = _seconds(task, task.short, config, sink)
                    samples[config].append((long - short) / task.marginal_steps)
            median = {config: statistics.median(values) for config, values in samples.items()}
            ratio = median["on"] / median["off"]
            worst = max(worst, ratio)
            rows.append(
                (
                    f"{task.name}, batch {task.batch_size}",
                    f"{median['off'] * 1e6:.0f}",
                    f"{median['on'] * 1e6:.0f}",
                    f"{ratio:.3f}×",
                    *(f"{median[alone] / median['off']:.3f}×" for alone in configs[2:]),
                )
            )
    print(f"training step, CPU, {args.threads} thread(s); median of {args.rounds} rounds, marginal µs per step")
    header = ("case", "off µs", "on µs", "on / off", "on, every 10ba / off", *(f"{alone} alone / off" for alone in configs[3:]))
    print(format_table(header, rows))
    print(f"\nmonitors, loggers and bar on / off, worst {worst:.3f}× (target ≤ 1.03×: {'meets' if worst <= 1.03 else 'misses'})")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
