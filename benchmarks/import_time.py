"""Start-up cost: seconds to ``import torch``, ``import composer_fn`` and answer ``composer-fn --help``.

What is measured: the wall time of a fresh interpreter, from its start to its exit, running

- ``pass`` (the interpreter's own start, the floor under every other row);
- ``import torch``;
- ``import composer_fn`` (public names load on first use) and ``from composer_fn import *`` (every public
  name loaded: the trainer, the algorithm records, ``functional``, ``optim``, ``random``);
- ``composer-fn --help`` (the console script next to this interpreter, else ``python -m composer_fn --help``);
- in the peer interpreter, in the same rounds: ``pass``, ``import torch`` and ``import composer`` (Composer
  0.32.1, whose ``import composer`` loads its trainer, algorithms and callbacks).

Every round runs every command once, in an order that rotates between rounds, after one untimed run of each
(which warms the file cache). The table shows the best and the median round and the interquartile range.
Target: ``import composer_fn`` and the whole public surface in at most 1.5 s (median).

The package under test is whichever ``composer_fn`` this interpreter imports; to measure another tree, run
from it with ``PYTHONPATH`` pointing at it (the header prints the tree it found).

    .venv/bin/python benchmarks/import_time.py [--rounds 7] [--json out.json] [--no-peer]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _peer import (
    PEER_ENV_SCRIPT,
    add_common_arguments,
    environment,
    find_peer_python,
    format_table,
    summary,
    write_json,
)

TARGET_S = 1.5
_PEER_VERSIONS = "import torch, composer; print(f'Composer {composer.__version__}, torch {torch.__version__}')"


@dataclass(frozen=True)
class Command:
    """A command timed in a fresh process: its row in the table, whose column, and its argv."""

    row: str
    column: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str | None = None

    def run(self) -> float:
        """Returns the seconds from the process's start to its exit."""
        started = time.perf_counter()
        finished = subprocess.run(
            self.argv, env=self.env, cwd=self.cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        elapsed = time.perf_counter() - started
        if finished.returncode != 0:
            tail = " | ".join(finished.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"{' '.join(self.argv)} exited with {finished.returncode}: {tail}")
        return elapsed


def _ask(argv: list[str], env: dict[str, str], cwd: str | None = None) -> str:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _help_command(python: str) -> tuple[str, ...]:
    script = Path(python).parent / "composer-fn"
    return (str(script), "--help") if os.access(script, os.X_OK) else (python, "-m", "composer_fn", "--help")


def commands(peer_python: str | None, threads: int) -> list[Command]:
    """Returns our commands and, when a peer interpreter is given, the peer's."""
    ours = dict(os.environ, OMP_NUM_THREADS=str(threads))
    python = sys.executable
    result = [
        Command("interpreter start", "ours", (python, "-c", "pass"), ours),
        Command("import torch", "ours", (python, "-c", "import torch"), ours),
        Command("import the library", "ours", (python, "-c", "import composer_fn"), ours),
        Command("every public name", "ours", (python, "-c", "from composer_fn import *"), ours),
        Command("command --help", "ours", _help_command(python), ours),
    ]
    if peer_python is not None:
        # The peer must not see our package (or anything else on our path).
        peer = {key: value for key, value in ours.items() if key != "PYTHONPATH"}
        cwd = tempfile.gettempdir()
        result += [
            Command("interpreter start", "peer", (peer_python, "-c", "pass"), peer, cwd),
            Command("import torch", "peer", (peer_python, "-c", "import torch"), peer, cwd),
            Command("import the library", "peer", (peer_python, "-c", "import composer"), peer, cwd),
        ]
    return result


def measure(runs: list[Command], rounds: int) -> dict[tuple[str, str], list[float]]:
    """Returns the seconds of every command by (row, column): one untimed run each, then one per round."""
    for command in runs:
        command.run()
    samples: dict[tuple[str, str], list[float]] = {}
    for round_index in range(rounds):
        if sys.stderr.isatty():
            print(f"round {round_index + 1}/{rounds}", end="\r", file=sys.stderr, flush=True)
        shift = round_index % len(runs)
        for command in runs[shift:] + runs[:shift]:
            samples.setdefault((command.row, command.column), []).append(command.run())
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--rounds", type=int, default=7, help="timed runs of every command (default 7)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds!r} must be >= 1")

    peer_python = None if args.no_peer else find_peer_python(args.peer_python)
    peer_note = ""
    if args.no_peer:
        peer_note = "peer column skipped (--no-peer)"
    elif peer_python is None:
        peer_note = f"peer column skipped: no peer environment found (build it with bash {PEER_ENV_SCRIPT})"
    runs = commands(peer_python, args.threads)
    tree = _ask([sys.executable, "-c", "import composer_fn; print(composer_fn.__file__)"], runs[0].env)
    torch_version = _ask([sys.executable, "-c", "import torch; print(torch.__version__)"], runs[0].env)
    peer_versions = ""
    if peer_python is not None:
        peer_command = runs[-1]
        try:
            peer_versions = _ask(
                [peer_python, "-c", _PEER_VERSIONS],
                peer_command.env,
                peer_command.cwd,
            )
        except (OSError, subprocess.CalledProcessError) as error:
            peer_note = f"peer column skipped: {error}"
            runs = [command for command in runs if command.column == "ours"]

    samples = measure(runs, args.rounds)
    stats = {key: summary(values) for key, values in samples.items()}

    print(f"composer_fn from {Path(tree).parent}, torch {torch_version}; peer: {peer_versions or 'none'}")
    print(f"fresh interpreters, wall time from start to exit, {args.rounds} rounds; seconds\n")
    labels = {
        "interpreter start": ("python -c pass", "python -c pass"),
        "import torch": ("import torch", "import torch"),
        "import the library": ("import composer_fn", "import composer"),
        "every public name": ("from composer_fn import *", ""),
        "command --help": ("composer-fn --help", ""),
    }

    def figures(row: str, column: str) -> list[str]:
        found = stats.get((row, column))
        return [f"{found[key]:.3f}" for key in ("min", "median", "iqr")] if found else ["", "", ""]

    rows = [
        [ours_label, *figures(row, "ours"), peer_label if (row, "peer") in stats else "", *figures(row, "peer")]
        for row, (ours_label, peer_label) in labels.items()
    ]
    header = ["composer_fn", "best", "median", "IQR", "Composer", "best", "median", "IQR"]
    print(format_table(header, rows, align="<>>><>>>"))

    ours_import = stats[("import the library", "ours")]["median"]
    surface = stats[("every public name", "ours")]["median"]
    extra = f"composer_fn's whole public surface {surface - stats[('import torch', 'ours')]['median']:+.3f} s"
    if ("import the library", "peer") in stats:
        # import composer loads Composer's whole public surface, so it compares with ours, not with import composer_fn.
        peer_import = stats[("import the library", "peer")]["median"]
        extra += f", Composer's import composer {peer_import - stats[('import torch', 'peer')]['median']:+.3f} s"
        print(
            f"\nfrom composer_fn import * vs import composer (medians): {surface:.3f} s vs {peer_import:.3f} s, "
            f"{peer_import / surface:.1f}x faster"
        )
    print(f"over import torch in the same interpreter (medians): {extra}")
    for what, seconds in (("import composer_fn", ours_import), ("from composer_fn import *", surface)):
        verdict = "met" if seconds <= TARGET_S else "MISSED"
        print(f"target: {what} <= {TARGET_S} s (median): {verdict} ({seconds:.3f} s)")
    if peer_note:
        print(peer_note)

    if args.json is not None:
        report: dict[str, Any] = {
            "benchmark": "import_time",
            "environment": environment(args.threads),
            "tree": tree,
            "peer": peer_versions,
            "samples": {f"{column}: {row}": values for (row, column), values in samples.items()},
            "summaries": {f"{column}: {row}": figures for (row, column), figures in stats.items()},
            "target_s": TARGET_S,
        }
        write_json(args.json, report)


if __name__ == "__main__":
    main()
