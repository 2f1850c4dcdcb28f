"""Pictures of runs: one PNG of what a run (or several, overlaid) logged, by step and by wall time.

A run is the JSON-lines file that ``JSONLLogger`` (the CLI's ``--log-file``) wrote, or a folder holding one.
The picture has six panels: the training loss, the held-out metric (accuracy, else loss) and the learning rate
by step; the training loss and the held-out metric by wall time (the accuracy-against-time picture that
compares methods); and the throughput by step. A dotted line marks each step where algorithms switched on
(``+name``) or off (``-name``), from the log's ``plan`` records.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Run", "read_run", "write_report"]

WIDTH, HEIGHT, DPI = 15, 8, 100
"""The picture's size in inches and its resolution: 1500 × 800 pixels."""


@dataclass(frozen=True)
class Run:
    """A run's records by kind, as logged, with the name it is shown under."""

    label: str
    train: tuple[dict[str, Any], ...]
    eval: tuple[dict[str, Any], ...]
    plan: tuple[dict[str, Any], ...]


def _log_file(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise ValueError(f"run {str(path)!r} does not exist: expected a run folder or its JSON-lines log")
    logs = sorted(path.glob("*.jsonl"))
    if len(logs) != 1:
        found = ", ".join(log.name for log in logs) if logs else "none"
        raise ValueError(
            f"run folder {str(path)!r} holds {len(logs)} JSON-lines logs ({found}): expected exactly one, or pass "
            "the log file itself"
        )
    return logs[0]


def read_run(path: str | os.PathLike[str], label: str | None = None) -> Run:
    """Returns the records of the run at ``path`` (a run folder holding one ``*.jsonl`` log, or the log)."""
    if isinstance(path, bool) or not isinstance(path, str | os.PathLike):
        raise TypeError(f"run={path!r} must be a run folder or its JSON-lines log (a str or os.PathLike)")
    if label is not None and not isinstance(label, str):
        raise TypeError(f"label={label!r} must be a str (the run's name in the legend) or None")
    log = _log_file(Path(path))
    kinds: dict[str, list[dict[str, Any]]] = {"train": [], "eval": [], "plan": []}
    stepless: list[int] = []
    try:
        text = log.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        with log.open("rb") as stream:
            archive = stream.read(4) == b"PK\x03\x04"
        what = "a zip archive, such as a checkpoint" if archive else "binary"
        raise ValueError(
            f"{log} is not a JSON-lines log: it is {what}, not text; expected the log JSONLLogger (--log-file) writes"
        ) from None
    except OSError as error:
        raise ValueError(f"{log} cannot be read ({error.strerror or error}): expected a JSON-lines log") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{log}:{number} is not a JSON record ({error.msg}): expected one object a line") from None
        if isinstance(record, dict) and record.get("kind") in kinds:
            if record["kind"] != "plan" and not _number(record.get("step")):
                stepless.append(number)
                continue
            kinds[record["kind"]].append(record)
    if stepless:
        lines = ", ".join(map(str, stepless[:5])) + (", ..." if len(stepless) > 5 else "")
        warnings.warn(
            f"{log}: {len(stepless)} training or evaluation record(s) have no numeric step (line {lines}); they are "
            "left out of every panel",
            stacklevel=2,
        )
    if not kinds["train"] and not kinds["eval"]:
        raise ValueError(f"{log} holds no training or evaluation record: expected a log written by JSONLLogger")
    name = label if label is not None else (log.parent.name if log.name == "log.jsonl" else log.stem)
    return Run(name, tuple(kinds["train"]), tuple(kinds["eval"]), tuple(kinds["plan"]))


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _series(records: Sequence[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    pairs = [(r[x], r[y]) for r in records if _number(r.get(x)) and _number(r.get(y))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _held_out(runs: Sequence[Run]) -> str:
    # The held-out accuracy when logged (a named evaluator's too), else the first held-out metric logged.
    logged = [name for run in runs for r in run.eval for name in r if name.startswith("eval")]
    for wanted in ("/accuracy", "eval/eval/loss"):
        found = next((name for name in logged if name.endswith(wanted)), None)
        if found is not None:
            return found
    return logged[0] if logged else "eval/eval/accuracy"


def write_report(
    runs: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str] | None = None, *, labels: Sequence[str] = ()
) -> Path:
    """Writes the picture of ``runs`` (overlaid, one colour each) to ``output`` and returns its path.

    ``output`` defaults to ``report.png`` in the first run's folder. ``labels`` name the runs in the legend
    (default: each run's folder name, or its log's name). A metric a panel draws that a run logged without one
    finite value (all NaN), or did not log, leaves that run out of the panel, with a warning naming both.
    """
    if isinstance(runs, str | os.PathLike):
        raise TypeError(f"runs={runs!r} must be a list of run folders or JSON-lines logs, e.g. [{str(runs)!r}]")
    if not runs:
        raise ValueError("runs is empty: expected at least one run folder or JSON-lines log")
    if isinstance(labels, str):
        raise TypeError(f"labels={labels!r} must be a list of names, one a run, e.g. [{labels!r}]")
    if labels and len(labels) != len(runs):
        raise ValueError(f"labels has {len(labels)} names for {len(runs)} runs: expected one a run, or none")
    read = [read_run(run, labels[i] if labels else None) for i, run in enumerate(runs)]
    if output is not None and (isinstance(output, bool) or not isinstance(output, str | os.PathLike)):
        raise TypeError(f"output={output!r} must be the path of a .png file (a str or os.PathLike) or None")
    target = Path(output) if output is not None else _log_file(Path(runs[0])).parent / "report.png"
    if target.suffix.lower() != ".png" or target.is_dir():
        raise ValueError(f"output={str(target)!r}: expected the path of a .png file, e.g. 'runs/report.png'")
    from composer_fn.loggers._paths import file_path

    file_path("output", str(target), "runs/report.png")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH, HEIGHT), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 3)
    held_out = _held_out(read)
    rate = "lr" if all(any("lr" in r for r in run.train) for run in read) else "lr_multiplier"
    panels = (
        (axes[0][0], "train", "step", "loss", "training loss"),
        (axes[0][1], "eval", "step", held_out, f"held-out {_title(held_out)}"),
        (axes[0][2], "train", "step", rate, "learning rate" if rate == "lr" else "learning-rate multiplier"),
        (axes[1][0], "train", "wall_time", "loss", "training loss"),
        (axes[1][1], "eval", "wall_time", held_out, f"held-out {_title(held_out)}"),
        (axes[1][2], "train", "step", "samples_per_second", "throughput (samples/s)"),
    )
    _warn_empty(read, panels)
    colours = [f"C{i % 10}" for i in range(len(read))]
    for ax, kind, x, y, title in panels:
        for run, colour in zip(read, colours, strict=True):
            xs, ys = _series(run.train if kind == "train" else run.eval, x, y)
            ax.plot(xs, ys, color=colour, label=run.label, marker="o" if kind == "eval" else None, markersize=3)
            if x == "step":
                _mark_switches(ax, run, colour)
        ax.set_title(title)
        ax.set_xlabel("step" if x == "step" else "wall time (s)")
        ax.grid(True, alpha=0.3)
    if len(read) > 1:
        axes[1][1].legend(loc="best")
    figure.suptitle(" vs ".join(run.label for run in read))
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, dpi=DPI)
    return target


def _warn_empty(runs: Sequence[Run], panels: Sequence[tuple[Any, str, str, str, str]]) -> None:
    """Warns once for each run and metric a panel draws that the run logged with no finite value, or not at all."""
    seen = set()
    for run in runs:
        for _, kind, _, metric, title in panels:
            if (run.label, kind, metric) in seen:
                continue
            seen.add((run.label, kind, metric))
            records = run.train if kind == "train" else run.eval
            values = [r[metric] for r in records if _number(r.get(metric))]
            odd = [r[metric] for r in records if metric in r and r[metric] is not None and not _number(r[metric])]
            if odd:
                warnings.warn(
                    f"run {run.label!r}: {len(odd)} of its {kind} records hold {metric} as something other than a number "
                    f"(e.g. {odd[0]!r}); the {title} panel leaves them out",
                    stacklevel=3,
                )
            if not values:
                what = f"{metric} in its {len(records)} {kind} records" if records else f"any {kind} record"
                warnings.warn(f"run {run.label!r} logged no {what}: the {title} panel has no line for it", stacklevel=3)
            elif not any(math.isfinite(value) for value in values):
                warnings.warn(
                    f"run {run.label!r}: {metric} has no finite value (all {len(values)} logged are NaN or infinite); "
                    f"the {title} panel has no line for it",
                    stacklevel=3,
                )


def _title(metric: str) -> str:
    # eval/eval/accuracy -> accuracy (a plain eval_dataloader's); eval/val/f1 -> f1 (val)
    if metric.startswith("eval/") and metric.count("/") >= 2:
        _, label, name = metric.split("/", 2)
        return name if label == "eval" else f"{name} ({label})"
    return metric


def _mark_switches(ax: Any, run: Run, colour: str) -> None:
    # Each switch: a dotted line, labelled at the top with the algorithms switched on (+) or off (-).
    for record in run.plan:
        step = record.get("step")
        if not isinstance(step, int | float):
            continue
        ax.axvline(step, color=colour, linestyle=":", linewidth=1)
        sign = "+" if "on" in record else "-"
        names = ", ".join(sign + name for name in record.get("on", record.get("off", [])))
        ax.annotate(
            names,
            xy=(step, 1.0),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=7,
            color=colour,
            va="top",
            ha="left",
        )
