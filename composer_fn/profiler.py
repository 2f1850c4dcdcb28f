"""Profiling a run: ``Trainer(profiler=Profiler(...))`` records steps with ``torch.profiler`` on a schedule.

Each recorded cycle becomes one Chrome trace per process (``<trace_folder>/rank<r>.<step>.pt.trace.json``,
open it in ``chrome://tracing`` or Perfetto) holding, besides torch's operators:

- the run's own markers: ``event/<EVENT>`` around each host-side event, and ``<algorithm>/<event>`` around each
  algorithm's hook (host hooks always; hooks inside the step when the step runs eagerly);
- the machine's CPU and memory use, sampled at each recorded step (psutil), as counter tracks.

``composer-fn profile`` trains a few steps under a profiler and prints the operators that took longest and the
time each algorithm's hooks took (``summarize``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from composer_fn.core import validate
from composer_fn.core.engine import Plan
from composer_fn.core.event import Event

__all__ = ["Profiler", "ProfileSession", "marked", "summarize"]


@dataclass(frozen=True)
class Profiler:
    """What to profile and where the traces go.

    Args:
        trace_folder: where each process writes its Chrome traces (created if missing).
        schedule: ``(wait, warmup, active, repeat)`` steps, as ``torch.profiler.schedule``: skip ``wait``,
            warm up ``warmup``, record ``active``; ``repeat`` such cycles (0: until the run ends).
        record_shapes: record each operator's input shapes.
        profile_memory: record tensor allocations.
        with_stack: record Python stacks (large traces).
        system_metrics: add the machine's CPU and memory use as counter tracks.
    """

    trace_folder: str | os.PathLike[str] = "runs/profile"
    schedule: tuple[int, int, int, int] = (1, 1, 3, 1)
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    system_metrics: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, tuple | list) or len(self.schedule) != 4:
            raise ValueError(f"schedule={self.schedule!r}: expected (wait, warmup, active, repeat), four whole numbers")
        for name, value, minimum in zip(("wait", "warmup", "active", "repeat"), self.schedule, (0, 0, 1, 0), strict=True):
            validate.integer(f"schedule's {name}", value, minimum=minimum, hint="steps" if name != "repeat" else "cycles")
        for name in ("record_shapes", "profile_memory", "with_stack", "system_metrics"):
            validate.flag(name, getattr(self, name))
        object.__setattr__(self, "schedule", tuple(self.schedule))


class ProfileSession:
    """A profiler running over one ``fit``: ``start``, ``step`` after each training step, ``stop``."""

    def __init__(self, profiler: Profiler, rank: int = 0) -> None:
        self.profiler = profiler
        self.rank = rank
        self.folder = Path(profiler.trace_folder)
        self.traces: list[Path] = []
        self._samples: list[tuple[int, float, float]] = []
        self._profile: Any = None

    def start(self) -> None:
        """Starts recording on the schedule."""
        self.folder.mkdir(parents=True, exist_ok=True)
        wait, warmup, active, repeat = self.profiler.schedule
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
            on_trace_ready=self._write,
            record_shapes=self.profiler.record_shapes,
            profile_memory=self.profiler.profile_memory,
            with_stack=self.profiler.with_stack,
        )
        self._profile.__enter__()

    def step(self) -> None:
        """Marks the end of a training step (and samples the machine while recording)."""
        recording = (torch.profiler.ProfilerAction.RECORD, torch.profiler.ProfilerAction.RECORD_AND_SAVE)
        if self.profiler.system_metrics and self._profile.current_action in recording:
            import psutil

            self._samples.append((time.time_ns(), psutil.cpu_percent(interval=None), psutil.virtual_memory().percent))
        self._profile.step()

    def stop(self) -> None:
        """Stops recording; a cycle still open is written."""
        if self._profile is not None:
            self._profile.__exit__(None, None, None)
            self._profile = None

    def _write(self, profile: Any) -> None:
        path = self.folder / f"rank{self.rank}.{profile.step_num}.pt.trace.json"
        profile.export_chrome_trace(str(path))
        if self._samples:
            trace = json.loads(path.read_text())
            base = int(trace.get("baseTimeNanoseconds", 0))
            pid = os.getpid()
            for stamp, cpu, memory in self._samples:
                ts = (stamp - base) / 1000
                trace["traceEvents"].append({"name": "cpu_percent", "ph": "C", "ts": ts, "pid": pid, "args": {"cpu": cpu}})
                trace["traceEvents"].append(
                    {"name": "memory_percent", "ph": "C", "ts": ts, "pid": pid, "args": {"memory": memory}}
                )
            self._samples = []
            path.write_text(json.dumps(trace))
        self.traces.append(path)


def _marker(name: str, hook: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        if torch.compiler.is_compiling():
            return hook(*args)
        with torch.profiler.record_function(name):
            return hook(*args)

    return run


def marked(plan: Plan) -> Plan:
    """Returns ``plan`` with each hook inside a ``<algorithm>/<event>`` profiler range (none in a compiled step);
    it plans the same (equal order and keys)."""

    def wrap(hooks: dict[Event, tuple[Callable[..., Any], ...]]) -> dict[Event, tuple[Callable[..., Any], ...]]:
        return {
            event: tuple(_marker(f"{name}/{event.value}", hook) for name, hook in zip(plan.names(event), chain, strict=True))
            for event, chain in hooks.items()
        }

    return dataclasses.replace(plan, hooks=wrap(dict(plan.hooks)), host=wrap(dict(plan.host)))


def summarize(traces: Iterable[str | os.PathLike[str]], top: int = 15) -> str:
    """Returns the operators that took longest (time including what they call) and the time of each algorithm's
    hooks and each host event in ``traces``, as text."""
    operators: dict[str, list[float]] = defaultdict(list)
    algorithms: dict[str, float] = defaultdict(float)
    events: dict[str, float] = defaultdict(float)
    for path in traces:
        for entry in json.loads(Path(path).read_text()).get("traceEvents", []):
            if entry.get("ph") != "X":
                continue
            name, duration = str(entry.get("name", "")), float(entry.get("dur", 0.0))
            if entry.get("cat") == "user_annotation":
                if name.startswith("event/"):
                    events[name.removeprefix("event/")] += duration
                elif "/" in name and not name.startswith("ProfilerStep"):
                    algorithms[name.split("/", 1)[0]] += duration
            elif entry.get("cat") == "cpu_op":
                operators[name].append(duration)
    lines = [f"{'operator':<40} {'calls':>7} {'total ms':>10}"]
    ranked = sorted(operators.items(), key=lambda item: -sum(item[1]))[:top]
    lines += [f"{name[:40]:<40} {len(times):>7} {sum(times) / 1e3:>10.3f}" for name, times in ranked]
    lines.append("")
    lines.append(f"{'algorithm (its hooks)':<40} {'total ms':>10}")
    lines += [f"{name:<40} {total / 1e3:>10.3f}" for name, total in sorted(algorithms.items(), key=lambda i: -i[1])]
    if not algorithms:
        lines.append("(no algorithm hook ran while recording)")
    lines.append("")
    lines.append(f"{'host event':<40} {'total ms':>10}")
    lines += [f"{name:<40} {total / 1e3:>10.3f}" for name, total in sorted(events.items(), key=lambda i: -i[1])]
    return "\n".join(lines)
