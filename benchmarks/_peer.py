"""Shared benchmark plumbing: peers in their own interpreter, repeat statistics, tables and JSON output.

Peers (MosaicML Composer 0.32.1, PyTorch Lightning) live in a separate virtual environment whose pins
conflict with ours, so they are never imported here. ``Peer`` starts the peer interpreter once, hands it a
block of source code, and then calls the functions that code defines, one request at a time over a pipe:
a request is one JSON line, the answer is one JSON line. Because every call waits for its answer, our
measurements and the peer's never overlap in time, and a benchmark can alternate rounds (ours, peer, ours,
peer, ...) so that slow drifts of a shared machine fall on both columns alike.

The peer interpreter is found from ``--peer-python``, then ``$PEER_PYTHON``, then
``${PEER_VENV:-/tmp/peer-venv}/bin/python`` (what ``../shared/tools/peer-env.sh`` builds). When none is
found, or the peer fails, the caller prints that the peer column was skipped and carries on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "Peer",
    "PeerError",
    "add_common_arguments",
    "interleaved_times",
    "rotated_rounds",
    "find_peer_python",
    "pin_threads",
    "summary",
    "format_table",
    "environment",
    "write_json",
]

PEER_ENV_SCRIPT = Path(__file__).resolve().parents[2] / "shared" / "tools" / "peer-env.sh"

# The server the peer interpreter runs. Protocol answers go to a private copy of the original stdout;
# fd 1 is pointed at stderr so that whatever the peer libraries print cannot corrupt the protocol.
_SERVER = r"""
import json, os, sys, traceback
_proto = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
def _answer(payload):
    _proto.write(json.dumps(payload) + "\n")
    _proto.flush()
_hello = json.loads(sys.stdin.readline())
os.environ.setdefault("OMP_NUM_THREADS", str(_hello["threads"]))
_namespace = {"__name__": "peer", "THREADS": _hello["threads"]}
try:
    exec(compile(_hello["source"], "<peer>", "exec"), _namespace)
    _answer({"ok": True, "result": _namespace["setup"]() if "setup" in _namespace else None})
except BaseException:
    _answer({"ok": False, "error": traceback.format_exc()})
    raise SystemExit(1)
for _line in sys.stdin:
    _request = json.loads(_line)
    try:
        _answer({"ok": True, "result": _namespace[_request["call"]](**_request["kwargs"])})
    except BaseException:
        _answer({"ok": False, "error": traceback.format_exc()})
"""


class PeerError(RuntimeError):
    """The peer interpreter is missing, failed to start, failed a call, or did not answer in time."""


def find_peer_python(explicit: str | None = None) -> str | None:
    """Returns the peer interpreter's path, or None when no peer environment is present."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    candidates = [os.environ.get("PEER_PYTHON")]
    candidates.append(str(Path(os.environ.get("PEER_VENV", "/tmp/peer-venv")) / "bin" / "python"))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class Peer:
    """A peer interpreter serving the functions defined by ``source`` (plus an optional ``setup()``).

    ``start()`` returns at once; the peer imports its libraries in the background, so a caller may do
    untimed work meanwhile and call ``wait_ready()`` before the first timed round. ``call(name, **kwargs)``
    runs ``name(**kwargs)`` in the peer and returns its JSON result.
    """

    def __init__(self, python: str, source: str, *, threads: int, timeout: float = 120.0) -> None:
        self.python = python
        self.source = source
        self.threads = threads
        self.timeout = timeout
        self.info: Any = None
        self._process: subprocess.Popen[str] | None = None
        self._log = tempfile.NamedTemporaryFile("w+", prefix="peer-", suffix=".log", delete=False)
        self._ready = False

    def start(self) -> Peer:
        """Returns self after launching the peer interpreter (without waiting for its imports)."""
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads), PYTHONUNBUFFERED="1")
        # The peer must not see our package (or anything else on our path).
        env.pop("PYTHONPATH", None)
        try:
            self._process = subprocess.Popen(
                [self.python, "-u", "-c", _SERVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                text=True,
                env=env,
                cwd=tempfile.gettempdir(),
            )
        except OSError as error:
            raise PeerError(f"cannot start {self.python}: {error}") from error
        self._send({"source": self.source, "threads": self.threads})
        return self

    def wait_ready(self) -> Any:
        """Returns what the peer's ``setup()`` returned, once its imports and setup are done."""
        if not self._ready:
            self.info = self._receive()
            self._ready = True
        return self.info

    def call(self, name: str, **kwargs: Any) -> Any:
        """Returns the JSON result of ``name(**kwargs)`` run in the peer."""
        self.wait_ready()
        self._send({"call": name, "kwargs": kwargs})
        return self._receive()

    def close(self) -> None:
        """Stops the peer interpreter (it exits when its stdin closes) and removes its log."""
        process = self._process
        if process is not None:
            try:
                if process.stdin is not None:
                    process.stdin.close()
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
            self._process = None
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, payload: dict[str, Any]) -> None:
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(payload) + "\n")
            self._process.stdin.flush()
        except OSError as error:
            raise PeerError(f"the peer stopped: {error}; {self._log_tail()}") from error

    def _receive(self) -> Any:
        assert self._process is not None and self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], self.timeout)
        if not ready:
            raise PeerError(f"no answer from the peer within {self.timeout:.0f} s")
        line = self._process.stdout.readline()
        if not line:
            raise PeerError(f"the peer exited (code {self._process.poll()}); {self._log_tail()}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise PeerError("the peer raised:\n" + answer["error"].rstrip().splitlines()[-1])
        return answer["result"]

    def _log_tail(self, lines: int = 5) -> str:
        self._log.flush()
        text = Path(self._log.name).read_text(errors="replace").strip().splitlines()
        return "its last output: " + " | ".join(text[-lines:]) if text else "it printed nothing"


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--threads``, ``--json``, ``--no-peer`` and ``--peer-python`` to a benchmark's parser."""
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, pinned)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results here")
    parser.add_argument("--no-peer", action="store_true", help="skip the peer columns (Composer, Lightning)")
    parser.add_argument(
        "--peer-python",
        default=None,
        metavar="PATH",
        help="the peer environment's python (default: $PEER_PYTHON, then $PEER_VENV or /tmp/peer-venv)",
    )


def pin_threads(threads: int) -> None:
    """Pins torch (and OpenMP, for processes started later) to ``threads`` intra-op threads."""
    import torch

    if threads < 1:
        raise ValueError(f"--threads={threads!r} must be >= 1")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def summary(values: Sequence[float]) -> dict[str, float]:
    """Returns the median, best (min), interquartile range and count of repeated measurements."""
    ordered = sorted(values)
    if len(ordered) >= 4:
        quartiles = statistics.quantiles(ordered, n=4)
        iqr = quartiles[2] - quartiles[0]
    else:
        iqr = ordered[-1] - ordered[0]
    return {"median": statistics.median(ordered), "min": ordered[0], "iqr": iqr, "n": float(len(ordered))}


def interleaved_times(
    groups: Mapping[str, Mapping[str, Callable[[int], None]]], rounds: int, steps: int
) -> dict[tuple[str, str], list[float]]:
    """Returns seconds per step of every runner, by (group, name): one sample per round, rotating the order.

    Each runner is called once to warm up, then timed over ``steps`` calls; within a round the order of a group's
    runners rotates, so a slow drift of a shared machine lands on all of them alike.
    """
    samples: dict[tuple[str, str], list[float]] = {}
    for round_index in range(rounds):
        for group, runners in groups.items():
            names = list(runners)
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                runner = runners[name]
                runner(1)
                started = time.perf_counter()
                runner(steps)
                samples.setdefault((group, name), []).append((time.perf_counter() - started) / steps)
    return samples


def rotated_rounds(contenders: Mapping[str, Callable[[], dict[str, Any]]], rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Returns each contender's results, one per round: within a round the contenders run one after another in an
    order that rotates from round to round (so a slow drift of a shared machine lands on all alike); each result
    is printed as it comes."""
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    names = list(contenders)
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(contenders[name]())
            print(f"round {round_index + 1} {name}: {samples[name][-1]}", flush=True)
    return samples


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    """Returns an aligned text table; ``align`` holds one of ``<``/``>`` per column (text left, numbers right)."""
    table = [list(header)] + [list(row) for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    align = align or "<" + ">" * (len(header) - 1)
    lines = [
        "  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(row, align, widths, strict=True)) for row in table
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(line.rstrip() for line in lines)


def environment(threads: int) -> dict[str, Any]:
    """Returns what identifies the run: interpreter, torch, threads, CPU count, host and date."""
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": threads,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "argv": sys.argv,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Writes ``payload`` as indented JSON to ``path`` (creating its folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
