"""What each python-docs method costs a training step: time per step of ``composer-fn train`` on the baseline recipe
and on each method's file, in rotating rounds, as a ratio to the baseline's step measured in the same round.

Each configuration is one ``composer-fn train`` run of ``--steps`` steps (a process of its own, both cores by
default), logged every ``--steps // 4`` steps; its time per step is marginal, between the first and the last
record, so the start-up, the first steps (a compiled step compiles there) and the final evaluation are left out.
Rounds rotate the configurations' order, so that a drift of the machine's speed falls on each alike; the table gives
each one's median over the rounds and its ratio to the baseline's median. A step of ALiBi trains rows a quarter as
long, four times as many: the same tokens as the baseline's step, as every configuration here. Methods whose work
changes over a run (SeqLengthWarmup's short rows in its first 30%, SelectiveBackprop's half backward from 50% to
90%) act on the same fractions of these short runs; the timed window leaves out the first quarter, so their figure
is the step in the window, not a whole run's mean: a whole run's time is the sweep's.

    .venv/bin/python benchmarks/python_docs_steps.py                 # every method and the recipes, ~25 min
    .venv/bin/python benchmarks/python_docs_steps.py --only alibi glu compile --rounds 3

Run it alone on the machine: anything else running on the cores shows in every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _peer import environment, format_table, write_json

ROOT = Path(__file__).resolve().parents[1]
METHODS = ROOT / "benchmarks" / "python-docs" / "methods"
BASELINE = ROOT / "recipes" / "python-docs-baseline.toml"


def configurations() -> dict[str, Path]:
    """The baseline, each method's file and the composed recipes, by name."""
    found = {"baseline": BASELINE}
    found.update({path.stem: path for path in sorted(METHODS.glob("*.toml"))})
    for name in ("mild", "hot"):
        found[f"recipe {name}"] = ROOT / "recipes" / f"python-docs-{name}.toml"
    return found


def step_time(config: Path, steps: int, threads: int, folder: Path) -> dict[str, Any]:
    """Runs ``steps`` steps of ``config``; returns its marginal seconds per step and the steps it spans."""
    interval = max(1, steps // 4)
    log = folder / "log.jsonl"
    log.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "composer_fn", "train", "--config", str(config),
        "--max-duration", f"{steps}ba", "--scale-schedule-ratio", "1",  # the same steps for every configuration
        "--log-interval", f"{interval}ba", "--eval-interval", f"{steps}ba",
        "--threads", str(threads), "--no-progress", "--log-file", str(log),
    ]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{finished.stdout[-2000:]}{finished.stderr[-2000:]}")
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    walls = {r["step"]: float(r["wall_time"]) for r in records if r.get("kind") == "train"}
    first, last = min(walls), max(walls)
    return {"seconds_per_step": (walls[last] - walls[first]) / (last - first), "from_step": first, "to_step": last}


def main(argv: list[str] | None = None) -> int:
    known = configurations()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help=f"among {', '.join(known)}")
    parser.add_argument("--steps", type=int, default=80, help="steps a run (default 80; timed from a quarter in)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if args.steps < 8:
        parser.error(f"--steps {args.steps}: expected at least 8 (the timing spans the last three quarters)")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected at least 1")
    chosen = ["baseline"] + [name for name in (args.only or known) if name != "baseline"]
    unknown = [name for name in chosen if name not in known]
    if unknown:
        parser.error(f"--only {unknown[0]}: expected among {', '.join(known)}")
    samples: dict[str, list[float]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory(prefix="python-docs-steps-") as tmp:
        for round_ in range(args.rounds):
            order = chosen[round_ % len(chosen):] + chosen[: round_ % len(chosen)]
            for name in order:
                measured = step_time(known[name], args.steps, args.threads, Path(tmp))
                samples[name].append(measured["seconds_per_step"])
                print(f"round {round_ + 1} {name}: {1000 * measured['seconds_per_step']:.1f} ms/step", flush=True)
    base = statistics.median(samples["baseline"])
    rows = [
        [name, f"{1000 * statistics.median(times):.1f}", f"{statistics.median(times) / base:.2f}",
         " ".join(f"{1000 * t:.0f}" for t in times)]
        for name, times in samples.items()
    ]  # fmt: skip
    print(f"\n{args.steps} steps a run (timed over the last {args.steps - max(1, args.steps // 4)}), "
          f"{args.rounds} rounds, {args.threads} threads")  # fmt: skip
    print(format_table(["configuration", "ms/step (median)", "vs baseline", "rounds (ms)"], rows))
    if args.json:
        write_json(args.json, {"environment": environment(args.threads), "seconds_per_step": samples})
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
