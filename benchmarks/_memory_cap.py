"""A per-process memory cap whose breach is a clean out-of-memory error in the process that breached it.

The cap is ``RLIMIT_DATA``: since Linux 4.7 it bounds a process's private writable mappings (``VmData`` in
``/proc/<pid>/status``), which is where every tensor, NumPy array and Python object lives. An allocation that
would cross it fails with ``ENOMEM``, so the process raises its own error
(``RuntimeError: ... DefaultCPUAllocator: can't allocate memory``, ``MemoryError``) instead of being killed.
Resource limits pass through ``fork`` and ``exec``, so every process a capped one starts (``torchrun``'s
workers, ``torch.multiprocessing.spawn`` children) gets the same cap, each for itself.

``VmData`` counts reserved memory as well as touched memory: ``import torch, transformers`` alone takes about
800 MiB of it (about 530 MiB resident), so a cap must leave room for that baseline. ``RLIMIT_AS`` is no use
here (torch maps gigabytes of address space at import), and a memory cgroup caps a group, not each process.

    .venv/bin/python benchmarks/_memory_cap.py --limit 1.5GiB -- python -c "import torch; torch.ones(2**29)"
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

# Each marker is how one allocator reports ENOMEM, the error a breached cap produces.
OUT_OF_MEMORY_MARKERS = (
    "can't allocate memory",  # torch's DefaultCPUAllocator
    "MemoryError",  # Python, and NumPy's _ArrayMemoryError
    "std::bad_alloc",  # C++ operator new
    "Cannot allocate memory",  # strerror(ENOMEM), e.g. an OSError from fork or mmap
    "OpenBLAS error: Memory allocation",
    "failed to map segment from shared object",  # a shared library that no longer fits, at import
    "out of memory",
    "OutOfMemoryError",
)
_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9}
_UNITS |= {"KI": 2**10, "KIB": 2**10, "MI": 2**20, "MIB": 2**20, "GI": 2**30, "GIB": 2**30}
_TAIL_LINES = 40


@dataclasses.dataclass(frozen=True)
class CappedResult:
    """How a capped command ended.

    ``peak_rss_bytes`` is the largest resident set any one process of the command reached (the kernel's
    ``ru_maxrss`` over the process and every descendant it waited for). ``out_of_memory_line`` is the first
    stderr line that reports an allocation failure, so with ``torchrun`` it names the rank (``[rank0]: ...``).
    """

    command: tuple[str, ...]
    limit_bytes: int
    returncode: int
    out_of_memory: bool
    out_of_memory_line: str | None
    timed_out: bool
    peak_rss_bytes: int
    elapsed: float
    stderr_tail: str


def parse_size(text: str) -> int:
    """Returns the byte count ``text`` names: ``"1.5GiB"``, ``"800MiB"``, ``"2G"`` (decimal) or ``"1073741824"``."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"size={text!r}: expected a number and an optional unit (B, KiB, MiB, GiB, K, M, G)")
    return int(float(match.group(1)) * _UNITS[unit])


def _checked_limit(limit_bytes: int) -> int:
    if not isinstance(limit_bytes, int) or isinstance(limit_bytes, bool) or limit_bytes <= 0:
        raise ValueError(f"limit_bytes={limit_bytes!r}: expected a positive number of bytes")
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY and limit_bytes > hard:
        raise ValueError(f"limit_bytes={limit_bytes}: above this process's hard RLIMIT_DATA of {hard} bytes")
    return limit_bytes


def apply_cap(limit_bytes: int) -> None:
    """Returns nothing; caps this process, and every process it starts from now on, at ``limit_bytes`` each.

    Memory the process already holds counts toward the cap, so a worker may call this after its imports.
    Only the soft limit is set, so ``memory_cap`` can lift it again.
    """
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (_checked_limit(limit_bytes), hard))


def capped(limit_bytes: int) -> Callable[[], None]:
    """Returns a ``preexec_fn`` for ``subprocess.Popen`` that caps the new process (and its own children)."""
    limit_bytes = _checked_limit(limit_bytes)
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)

    def cap_this_process() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, hard))

    return cap_this_process


@contextlib.contextmanager
def memory_cap(limit_bytes: int) -> Iterator[None]:
    """Returns a context in which this process and the processes it starts are capped at ``limit_bytes`` each.

    The cap is lifted on exit for this process; processes started inside keep it for their whole life.
    """
    previous = resource.getrlimit(resource.RLIMIT_DATA)
    apply_cap(limit_bytes)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, previous)


def run_capped(
    command: Sequence[str], limit_bytes: int, timeout: float, *, env: dict[str, str] | None = None
) -> CappedResult:
    """Returns how ``command`` ended when it and every process it starts were capped at ``limit_bytes`` each.

    stdout passes through; stderr is read line by line for out-of-memory reports and its last lines kept.
    Past ``timeout`` seconds the command's whole process group is killed and ``timed_out`` is set.
    """
    if not command:
        raise ValueError("command=[]: expected a program and its arguments")
    if timeout <= 0:
        raise ValueError(f"timeout={timeout!r}: expected a positive number of seconds")
    preexec = capped(limit_bytes)
    started = time.perf_counter()
    process = subprocess.Popen(
        list(command),
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=env,
        preexec_fn=preexec,
        start_new_session=True,  # one process group, so a timeout can end torchrun's workers too
    )
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    first_report: list[str] = []

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            tail.append(line.rstrip("\n"))
            if not first_report and any(marker in line for marker in OUT_OF_MEMORY_MARKERS):
                first_report.append(line.strip())

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    timed_out = False
    try:
        while True:
            # wait4, not waitpid: its rusage carries the peak resident set of the whole reaped tree.
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid == process.pid:
                break
            if time.perf_counter() - started > timeout:
                timed_out = True
                _kill_group(process.pid)
                _, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(0.02)
    except BaseException:
        # The command runs in its own session, so an interrupt here would not reach it otherwise.
        _kill_group(process.pid)
        process.wait()
        raise
    elapsed = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    reader.join(timeout=5.0)
    return CappedResult(
        command=tuple(command),
        limit_bytes=limit_bytes,
        returncode=process.returncode,
        out_of_memory=bool(first_report),
        out_of_memory_line=first_report[0] if first_report else None,
        timed_out=timed_out,
        peak_rss_bytes=usage.ru_maxrss * 1024,  # Linux reports KiB
        elapsed=elapsed,
        stderr_tail="\n".join(tail),
    )


def _kill_group(leader: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader, signal.SIGKILL)


def describe(result: CappedResult) -> str:
    """Returns a few lines saying whether the command ran, ran out of memory under its cap, or failed."""
    if result.timed_out:
        outcome = f"timed out after {result.elapsed:.1f} s"
    elif result.out_of_memory:
        outcome = "OUT OF MEMORY under the cap"
    elif result.returncode == 0:
        outcome = "ran to completion under the cap"
    else:
        outcome = f"failed (exit {result.returncode}) without an out-of-memory report"
    lines = [
        f"outcome: {outcome}",
        f"cap: {result.limit_bytes / 2**20:.0f} MiB of private memory per process (RLIMIT_DATA)",
        f"exit code: {result.returncode}   peak RSS of any one process: {result.peak_rss_bytes / 2**20:.0f} MiB"
        f"   elapsed: {result.elapsed:.1f} s",
    ]
    if result.out_of_memory_line is not None:
        lines.append(f"first out-of-memory report: {result.out_of_memory_line}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Returns the exit code of a command run under the cap, after printing its outcome."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=parse_size, required=True, help="cap per process, e.g. 1.5GiB")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the command is killed")
    parser.add_argument("--quiet", action="store_true", help="print only the outcome, not the stderr tail")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is required after --")
    result = run_capped(command, args.limit, args.timeout)
    if result.stderr_tail and not args.quiet:
        print(f"--- last {_TAIL_LINES} lines of stderr ---\n{result.stderr_tail}\n---", file=sys.stderr)
    print(describe(result))
    # A signal's death is reported the way a shell does, 128 + the signal's number.
    return result.returncode if result.returncode >= 0 else 128 - result.returncode


if __name__ == "__main__":
    sys.exit(main())
