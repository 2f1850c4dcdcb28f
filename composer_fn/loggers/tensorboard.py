"""TensorBoard and console destinations for the trainer's records.

``TensorBoardLogger`` writes through ``torch.utils.tensorboard.SummaryWriter``: the run's settings once, as
text ``hparams``; the plan of the run's start as ``composer-fn plan`` prints it, once, as text ``schedule``;
each training record's numbers as scalars ``train/<name>`` at its step (a name with a section, such as a
monitor's ``throughput/samples_per_second`` or an evaluator's ``eval/<label>/<metric>``, as it is); the run's
wall time as ``fit/wall_time``; each step where algorithms switch on or off, as text ``plan``.
``ConsoleLogger`` prints one readable line per training record and per evaluation, and the plan once, through
tqdm so that a progress bar stays intact."""

from __future__ import annotations

import io
import json
import math
import os
import sys
import time
from typing import Any, TextIO

from composer_fn.core import validate
from composer_fn.loggers._paths import folder_path
from composer_fn.loggers.base import Logger

__all__ = ["TensorBoardLogger", "ConsoleLogger"]

_SECTIONS = {"train": "train", "eval": "eval", "fit": "fit"}
_POSITION = ("step", "epoch")


class TensorBoardLogger(Logger):
    """Writes records as TensorBoard scalars and text under ``log_dir`` (created if missing).

    Args:
        log_dir: the folder of the event files, one run per folder (point ``tensorboard --logdir`` at its
            parent to compare runs).
        flush_secs: how often the writer flushes to disk, in seconds.
    """

    def __init__(self, log_dir: str | os.PathLike[str], flush_secs: int = 30) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:  # tensorboard is a dependency; a broken install still gets a clear word
            raise ImportError(f"TensorBoardLogger needs the tensorboard package ({error}): pip install tensorboard") from None
        flush_secs = validate.integer("flush_secs", flush_secs, minimum=1, hint="seconds")
        self.log_dir = folder_path("log_dir", log_dir, "runs/tb/digits")
        try:
            self._writer: Any = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)
        except OSError as error:  # checked above; a folder removed or made read-only meanwhile still gets a clear word
            raise ValueError(
                f"log_dir={str(log_dir)!r} cannot be written ({error.strerror or error}); expected a folder that can be written"
            ) from None
        # Records wait here and reach the writer's thread together, once a second at most: each hand-over wakes
        # that thread, which then competes with training for the interpreter.
        self._pending: list[tuple[str, dict[str, Any], float]] = []
        self._handed = time.monotonic()

    def log(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "hparams":
            settings = {name: value for name, value in record.items() if name != "kind"}
            self._writer.add_text("hparams", _code(json.dumps(settings, indent=2, sort_keys=True)), global_step=0)
            return
        if kind == "schedule":
            self._writer.add_text("schedule", _code(str(record["table"])), global_step=0)
            return
        if kind == "plan":
            self._hand_over()
            self._writer.add_text("plan", _switch(record), global_step=int(record["step"]))
            return
        section = _SECTIONS.get(str(kind))
        if section is None:
            return
        # Records wait as they are and become events together: building them in one go costs a fraction.
        self._pending.append((section, dict(record), time.time()))
        if kind != "train" or time.monotonic() - self._handed >= 1.0:
            self._hand_over()

    def _hand_over(self) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        writer = self._writer._get_file_writer()
        for section, record, wall in self._pending:
            values = [
                # A monitor's name carries its own section ("throughput/samples_per_second"); others get the record's.
                Summary.Value(tag=name if "/" in name else f"{section}/{name}", simple_value=float(value))
                for name, value in record.items()
                if name not in _POSITION and name != "kind" and validate.is_real(value)
            ]
            if values:
                # One event holds the record's scalars (a tenth of the cost of one event per scalar).
                writer.add_summary(Summary(value=values), int(record.get("step", 0)), wall)
        self._pending, self._handed = [], time.monotonic()

    def close(self) -> None:
        self._hand_over()
        self._writer.flush()
        self._writer.close()


class ConsoleLogger(Logger):
    """Prints one line per training record (step, epoch, loss, learning-rate multiplier, throughput, and the
    step time, MFU and time left when monitors give them) and per evaluation (its metrics) to ``stream``
    (default: standard error, where the progress bar is).

    Lines go out through tqdm, so that a progress bar stays intact. Training lines that come faster than one
    per ``flush_interval`` seconds wait for the next record and go out together (each write redraws the bar):
    no line is dropped, and evaluations, stops and the run's end are written at once with any waiting lines.

    Args:
        stream: where the lines go: a text stream (anything with ``write``), ``'stdout'`` or ``'stderr'`` (the
            interpreter's streams at the time of each write); None: standard error.
        flush_interval: the shortest time between two writes of training lines, in seconds (0: each at once).
    """

    def __init__(self, stream: TextIO | str | None = None, flush_interval: float = 0.1) -> None:
        self.stream = _stream(stream)
        self.flush_interval = validate.real("flush_interval", flush_interval, minimum=0.0, hint="seconds")
        self._waiting: list[str] = []
        self._written = -math.inf

    def log(self, record: dict[str, Any]) -> None:
        line = _line(record)
        if line is None:
            return
        self._waiting.append(line)
        now = time.monotonic()
        if record.get("kind") != "train" or now - self._written >= self.flush_interval:
            self._write()
            self._written = now

    def _write(self) -> None:
        if not self._waiting:
            return
        from tqdm import tqdm

        stream = getattr(sys, self.stream) if isinstance(self.stream, str) else self.stream
        tqdm.write("\n".join(self._waiting), file=stream if stream is not None else sys.stderr)
        self._waiting = []

    def close(self) -> None:
        self._write()


_STREAMS = ("stdout", "stderr")


def _stream(stream: object) -> TextIO | str | None:
    """Returns ``stream`` if it is None, ``'stdout'``, ``'stderr'`` or an open text stream; raises otherwise."""
    if stream is None or stream in _STREAMS:
        return stream  # type: ignore[return-value]
    accepted = "None, 'stdout', 'stderr' or an open text stream (an object with write(), e.g. sys.stdout)"
    if isinstance(stream, str):
        raise ValueError(
            f"stream={stream!r} must be {accepted}; to keep the records in a file, use JSONLLogger(path) or pass "
            "open(path, 'w')"
        )
    if not callable(getattr(stream, "write", None)):
        raise TypeError(f"stream={stream!r} of type {type(stream).__name__} must be {accepted}")
    if isinstance(stream, io.RawIOBase | io.BufferedIOBase) or "b" in str(getattr(stream, "mode", "")):
        raise TypeError(f"stream={stream!r} is a binary stream: expected {accepted}, e.g. open(path, 'w')")
    if getattr(stream, "closed", False) is True:
        raise ValueError(f"stream={stream!r} is closed: expected {accepted}")
    return stream  # type: ignore[return-value]


def _line(record: dict[str, Any]) -> str | None:
    kind = record.get("kind")
    where = f"[epoch {record.get('epoch', '?')} | batch {record.get('step', '?')}]"
    if kind == "train":
        line = (
            f"{where} loss {record['loss']:.4f} | lr × {record['lr_multiplier']:.4g} | "
            f"{record['samples_per_second']:,.0f} samples/s"
        )
        if "time/step_ms" in record:
            line += f" | {record['time/step_ms']:.1f} ms/step"
        if "throughput/mfu" in record:
            line += f" | MFU {record['throughput/mfu']:.1%}"
        if "time/remaining_seconds" in record:
            minutes, seconds = divmod(round(record["time/remaining_seconds"]), 60)
            line += f" | {minutes}:{seconds:02d} left"
        return line
    if kind == "eval":
        metrics = [
            f"{name} {value:.2%}" if "accuracy" in name else f"{name} {value:.4f}"
            for name, value in record.items()
            if name not in ("kind", *_POSITION) and validate.is_real(value)
        ]
        return f"{where} " + " | ".join(metrics)
    if kind == "plan":
        return f"[batch {record.get('step', '?')}] {_switch(record)}"
    if kind == "schedule":
        return f"the run's plan:\n{record['table']}"
    if kind == "fit":
        return f"[done at batch {record.get('step', '?')}] wall time {record.get('wall_time', float('nan')):.1f} s"
    return None


def _code(text: str) -> str:
    # TensorBoard renders text as markdown: indented lines keep their alignment.
    return "\n".join(f"    {line}" for line in text.splitlines())


def _switch(record: dict[str, Any]) -> str:
    """Returns a ``plan`` record as text: ``mixup on`` or ``selective_backprop off``."""
    switch = "on" if "on" in record else "off"
    return f"{', '.join(record.get(switch, []))} {switch}"
