"""Channels-last convolutions on the CPU against the same convolutions with oneDNN off: which ones are wrong.

Every case is a ``conv2d`` forward and backward (input and weight gradients) with oneDNN on, first with the
input and weight contiguous (the layout ChannelsLast falls back to), then channels-last; each is compared with
the float32 convolution in contiguous format with oneDNN off (``torch.backends.mkldnn``), which runs torch's
own kernels. Each case runs in a child process of its own, forked from a parent that has imported torch and
run one convolution on one thread (so the child starts warm, and no OpenMP worker is forked), so a case that
corrupts the heap, aborts or hangs (killed after 20 s) is a result and not the end of the sweep.

The grid: input channels 1-32; output channels 4, 8, 16, 32, depthwise (groups = output channels = input
channels) and, for even input channels from 4, 16 output channels in 2 groups; kernel 1×1 and 3×3; stride 1
and 2; padding 0 and 1; float32 and bfloat16; 1 and 2 intra-op threads; a batch of 2 images of
``--size``×``--size``. Each ISA given to ``--isa`` runs the grid in a process of its own with
``ONEDNN_MAX_CPU_ISA`` set (``native``: unset, the machine's own); the ISA oneDNN reports (its verbose header)
heads its section.

A layout of a case is wrong when the largest of the three relative errors ``‖ours − reference‖ / ‖reference‖``
exceeds 1e-4 (float32) or 2e-2 (bfloat16). The report counts each layout's verdicts and lists its wrong and
aborted cases, folded over input channels.

    .venv/bin/python benchmarks/channels_last_sweep.py [--isa native,AVX2] [--size 28] [--json out.json]
        [--quick]

``--quick`` keeps input channels 1-9 and 16, output channels 8 and 16 (about a thousand cases an ISA, 1-2
minutes). The full grid (about 5,600 cases an ISA) takes 4-8 minutes an ISA on a 2-core machine, more where
cases hang.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}
LAYOUTS = ("contiguous", "channels_last")
CASE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Case:
    """One convolution: its geometry, dtype and thread count."""

    in_channels: int
    out_channels: int
    kernel: int
    stride: int
    padding: int
    groups: int
    dtype: str
    threads: int

    def geometry(self) -> str:
        """Returns the case without its input channels, the key that the report folds over."""
        grouping = f"→{self.out_channels}"
        if self.groups > 1:
            grouping = "depthwise" if self.groups == self.in_channels else f"→{self.out_channels} g{self.groups}"
        return f"{self.kernel}×{self.kernel} s{self.stride} p{self.padding} {grouping}"


def grid(quick: bool) -> Iterator[Case]:
    """Yields the sweep's cases (see the module docstring)."""
    inputs = (*range(1, 10), 16) if quick else range(1, 33)
    outputs = (8, 16) if quick else (4, 8, 16, 32)
    for dtype in TOLERANCE:
        for threads in (1, 2):
            for kernel in (1, 3):
                for stride in (1, 2):
                    for padding in (0, 1):
                        for in_channels in inputs:
                            for out_channels in outputs:
                                yield Case(in_channels, out_channels, kernel, stride, padding, 1, dtype, threads)
                            yield Case(in_channels, in_channels, kernel, stride, padding, in_channels, dtype, threads)
                            if in_channels % 2 == 0 and in_channels > 2:
                                yield Case(in_channels, 16, kernel, stride, padding, 2, dtype, threads)


def run_case(case: Case, size: int, report: Callable[[str, dict[str, float]], None]) -> None:
    """Reports ``case``'s relative errors (``forward``, ``input_grad``, ``weight_grad``) with oneDNN on, first in
    contiguous format (the layout the guard falls back to) then channels-last; in this process."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(case.threads)
    generator = torch.Generator().manual_seed(case.in_channels * 1000 + case.out_channels)
    x = torch.randn(2, case.in_channels, size, size, generator=generator)
    w = torch.randn(case.out_channels, case.in_channels // case.groups, case.kernel, case.kernel, generator=generator)
    upstream = None

    def run(dtype: torch.dtype, layout: torch.memory_format, onednn: bool) -> tuple[Any, ...]:
        nonlocal upstream
        torch.backends.mkldnn.enabled = onednn
        xi = x.to(dtype).clone(memory_format=layout).requires_grad_()
        wi = w.to(dtype).clone(memory_format=layout).requires_grad_()
        out = F.conv2d(xi, wi, stride=case.stride, padding=case.padding, groups=case.groups)
        if upstream is None:
            upstream = torch.randn(out.shape, generator=generator)
        out.backward(upstream.to(dtype).contiguous(memory_format=layout))
        assert xi.grad is not None and wi.grad is not None
        return tuple(t.detach().float() for t in (out, xi.grad, wi.grad))

    reference = run(torch.float32, torch.contiguous_format, onednn=False)
    for name in LAYOUTS:
        ours = run(getattr(torch, case.dtype), getattr(torch, f"{name}_format" if name == "contiguous" else name), True)
        report(name, {
            part: float((a - b).norm() / b.norm().clamp_min(1e-30))
            for part, a, b in zip(("forward", "input_grad", "weight_grad"), ours, reference, strict=True)
        })  # fmt: skip


def in_child(case: Case, size: int) -> dict[str, Any]:
    """Returns ``case``'s result, computed in a forked child: each layout's errors, or how the child died."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)

        def report(layout: str, errors: dict[str, float]) -> None:
            os.write(write, (json.dumps({layout: errors}) + "\n").encode())

        try:
            run_case(case, size, report)
        except Exception as error:  # noqa: BLE001 - an exception is a result too
            os.write(write, (json.dumps({"error": f"{type(error).__name__}: {error}"}) + "\n").encode())
        os._exit(0)
    os.close(write)
    signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
    signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    result: dict[str, Any] = {}
    for line in b"".join(chunks).decode().splitlines():
        result.update(json.loads(line))
    for layout in LAYOUTS:
        if layout not in result and "error" not in result:
            died = signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
            result[layout] = {"abort": died}
            break
    return result


def verdict(case: Case, errors: dict[str, Any] | None) -> str:
    """Returns ``ok``, ``wrong`` or ``abort`` for one layout's result (``abort`` also when it never ran)."""
    if errors is None or "abort" in errors:
        return "abort"
    return "wrong" if max(errors.values()) > TOLERANCE[case.dtype] else "ok"


def onednn_isa() -> str:
    """Returns the ISA oneDNN reports (its verbose header) for a convolution in this process's environment."""
    code = (
        "import torch\n"
        "x = torch.randn(2, 8, 8, 8).contiguous(memory_format=torch.channels_last).requires_grad_()\n"
        "w = torch.randn(8, 8, 1, 1).contiguous(memory_format=torch.channels_last)\n"
        "with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):\n"
        "    torch.nn.functional.conv2d(x, w).sum().backward()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if ",isa:" in line:
            return line.split(",isa:", 1)[1].strip()
    return "unknown (oneDNN printed no ISA)"


def sweep(size: int, quick: bool) -> list[dict[str, Any]]:
    """Returns every case's result in this process's environment (its own ISA setting)."""
    import torch

    # The children start warm: torch imported, its first-call set-up done, by one thread (a forked child of a
    # process that has started OpenMP workers could hang).
    torch.set_num_threads(1)
    run_case(Case(3, 3, 3, 1, 1, 3, "float32", 1), 4, lambda *_: None)
    results = []
    for case in grid(quick):
        result = in_child(case, size)
        verdicts = {layout: verdict(case, result.get(layout)) for layout in LAYOUTS}
        results.append({"case": asdict(case), "result": result, "verdict": verdicts})
    return results


def fold(results: Sequence[dict[str, Any]]) -> list[str]:
    """Returns report lines: each layout's count of verdicts, then its wrong and aborted cases folded over input
    channels."""
    lines = []
    for layout in LAYOUTS:
        groups: dict[tuple[str, str, int, str], list[tuple[int, str]]] = defaultdict(list)
        counts: dict[str, int] = defaultdict(int)
        for entry in results:
            kind = entry["verdict"][layout]
            counts[kind] += 1
            if kind == "ok":
                continue
            case = Case(**entry["case"])
            errors = entry["result"].get(layout) or {"abort": entry["result"].get("error", "did not run")}
            detail = errors["abort"] if "abort" in errors else _worst(errors)
            groups[(case.dtype, case.geometry(), case.threads, kind)].append((case.in_channels, detail))
        lines.append(f"  {layout}: {counts['ok']} ok, {counts['wrong']} wrong, {counts['abort']} aborted")
        for (dtype, geometry, threads, kind), members in sorted(groups.items()):
            channels = _ranges([c for c, _ in members])
            details = ", ".join(f"{c}: {d}" for c, d in members[:5]) + (" …" if len(members) > 5 else "")
            lines.append(f"    {kind:5}  {dtype:8}  {threads} thr  {geometry:18}  in {channels:10}  {details}")
    return lines


def _worst(errors: dict[str, float]) -> str:
    name = max(errors, key=lambda k: errors[k])
    return f"{name} {errors[name]:.2g}"


def _ranges(values: Sequence[int]) -> str:
    ordered = sorted(set(values))
    spans: list[str] = []
    start = previous = ordered[0]
    for value in [*ordered[1:], None]:
        if value is not None and value == previous + 1:
            previous = value
            continue
        spans.append(f"{start}" if start == previous else f"{start}-{previous}")
        if value is not None:
            start = previous = value
    return ",".join(spans)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", default="native,AVX2", help="comma-separated ONEDNN_MAX_CPU_ISA values; native: unset")
    parser.add_argument("--size", type=int, default=28, help="input height and width")
    parser.add_argument("--quick", action="store_true", help="a smaller grid (see the docstring)")
    parser.add_argument("--json", type=Path, help="write every case's result here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report-isa", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.report_isa:
        print(onednn_isa())
        return
    if args.worker:
        print(json.dumps(sweep(args.size, args.quick)))
        return
    import torch

    print(f"torch {torch.__version__}, ATen CPU capability {torch.backends.cpu.get_cpu_capability()}")
    everything: dict[str, Any] = {}
    for isa in args.isa.split(","):
        env = {key: value for key, value in os.environ.items() if key not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
        if isa != "native":
            env["ONEDNN_MAX_CPU_ISA"] = isa
        command = [sys.executable, __file__, "--worker", "--size", str(args.size), *(["--quick"] if args.quick else [])]
        found = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
        results = json.loads(found.splitlines()[-1])
        reported = subprocess.run(
            [*command[:2], "--report-isa"], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        print(f"\nONEDNN_MAX_CPU_ISA={isa}: oneDNN runs {reported}; {len(results)} cases")
        print("\n".join(fold(results)))
        everything[isa] = {"onednn_isa": reported, "results": results}
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
