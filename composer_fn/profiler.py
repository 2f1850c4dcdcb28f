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
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from composer_fn.core import validate
from composer_fn.core.engine import Plan
from composer_fn.core.event import Event
from composer_fn.loggers._paths import folder_path

__all__ = ["Profiler", "ProfileSession", "marked", "summarize"]

_KINETO_LOG_LEVEL, _KINETO_QUIET = "KINETO_LOG_LEVEL", "6"
"""The tracing library's log threshold, and the level above its highest severity (nothing is logged)."""


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
        folder_path("trace_folder", self.trace_folder, "runs/profile")
        if not isinstance(self.schedule, tuple | list) or len(self.schedule) != 4:
            raise ValueError(f"schedule={self.schedule!r}: expected (wait, warmup, active, repeat), four whole numbers")
        schedule = tuple(
            validate.integer(f"schedule's {name}", value, minimum=minimum, hint="steps" if name != "repeat" else "cycles")
            for name, value, minimum in zip(("wait", "warmup", "active", "repeat"), self.schedule, (0, 0, 1, 0), strict=True)
        )
        for name in ("record_shapes", "profile_memory", "with_stack", "system_metrics"):
            validate.flag(name, getattr(self, name))
        object.__setattr__(self, "schedule", schedule)


class ProfileSession:
    """A profiler running over one ``fit``: ``start``, ``step`` after each training step, ``stop``."""

    def __init__(self, profiler: Profiler, rank: int = 0) -> None:
        self.profiler = profiler
        self.rank = rank
        self.folder = Path(profiler.trace_folder)
        self.traces: list[Path] = []
        self._samples: list[tuple[int, float, float]] = []
        self._profile: Any = None
        self._quieted = False

    def start(self, steps: int | None = None) -> None:
        """Starts recording on the schedule.

        Args:
            steps: the steps the run will train, when known: a schedule that waits and warms up for all of them
                records nothing, and gets a warning that says so.
        """
        wait, warmup, active, repeat = self.profiler.schedule
        if steps is not None and steps <= wait + warmup:
            warnings.warn(
                f"Profiler schedule={self.profiler.schedule!r} records nothing in this run of {steps} steps: it skips "
                f"{wait} (wait) and warms up {warmup} steps before recording; lower wait and warmup, or train longer",
                stacklevel=3,
            )
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(
                f"trace_folder={str(self.profiler.trace_folder)!r} cannot be created ({error.strerror or error}); "
                "expected a folder that can be written"
            ) from None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        elif _KINETO_LOG_LEVEL not in os.environ:
            # Without a GPU the tracing library still asks for one and logs its failure and its own stages to
            # standard error; quiet it for this session (a level the user set is kept).
            os.environ[_KINETO_LOG_LEVEL] = _KINETO_QUIET
            self._quieted = True
        try:
            self._profile = torch.profiler.profile(
                activities=activities,
                schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
                on_trace_ready=self._write,
                record_shapes=self.profiler.record_shapes,
                profile_memory=self.profiler.profile_memory,
                with_stack=self.profiler.with_stack,
            )
            self._profile.__enter__()
        except BaseException:
            self._profile = None
            self._unquiet()
            raise

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
            try:
                self._profile.__exit__(None, None, None)
            finally:
                self._profile = None
                self._unquiet()

    def _unquiet(self) -> None:
        if self._quieted:
            os.environ.pop(_KINETO_LOG_LEVEL, None)
            self._quieted = False

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


def summarize(traces: Iterable[str | os.PathLike[str]] | str | os.PathLike[str], top: int = 15) -> str:
    """Returns the operators that took longest (time including what they call) and the time of each algorithm's
    hooks and each host event in ``traces`` (trace files, or one), as text; names are shown whole."""
    top = validate.integer("top", top, minimum=1, hint="operators shown")
    paths = [traces] if isinstance(traces, str | os.PathLike) else list(traces)
    operators: dict[str, list[float]] = defaultdict(list)
    algorithms: dict[str, float] = defaultdict(float)
    events: dict[str, float] = defaultdict(float)
    for path in paths:
        for entry in _trace_events(path):
            if not isinstance(entry, dict) or entry.get("ph") != "X":
                continue
            name, duration = str(entry.get("name", "")), float(entry.get("dur", 0.0))
            if entry.get("cat") == "user_annotation":
                if name.startswith("event/"):
                    events[name.removeprefix("event/")] += duration
                elif "/" in name and not name.startswith("ProfilerStep"):
                    algorithms[name.split("/", 1)[0]] += duration
            elif entry.get("cat") == "cpu_op":
                operators[name].append(duration)
    ranked = sorted(operators.items(), key=lambda item: -sum(item[1]))[:top]
    width = max([40, *(len(name) for name, _ in ranked), *(len(name) for name in (*algorithms, *events))])
    lines = [f"{'operator':<{width}} {'calls':>7} {'total ms':>10}"]
    lines += [f"{name:<{width}} {len(times):>7} {sum(times) / 1e3:>10.3f}" for name, times in ranked]
    lines.append("")
    lines.append(f"{'algorithm (its hooks)':<{width}} {'total ms':>10}")
    lines += [f"{name:<{width}} {total / 1e3:>10.3f}" for name, total in sorted(algorithms.items(), key=lambda i: -i[1])]
    if not algorithms:
        lines.append("(no algorithm hook ran while recording)")
    lines.append("")
    lines.append(f"{'host event':<{width}} {'total ms':>10}")
    lines += [f"{name:<{width}} {total / 1e3:>10.3f}" for name, total in sorted(events.items(), key=lambda i: -i[1])]
    return "\n".join(lines)


def _trace_events(path: str | os.PathLike[str]) -> list[Any]:
    """Returns the events of the Chrome trace at ``path``; raises ValueError naming a file that is not one."""
    try:
        trace = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"trace {str(path)!r} cannot be read ({error.strerror or error}); expected a Chrome trace file") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"trace {str(path)!r} is not JSON: expected a Chrome trace (*.pt.trace.json)") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"trace {str(path)!r} holds no traceEvents list: expected a Chrome trace (*.pt.trace.json)")
    return events
