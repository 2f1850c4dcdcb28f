"""TensorBoard and console destinations for the trainer's records.

``TensorBoardLogger`` writes through ``torch.utils.tensorboard.SummaryWriter``: the run's settings once, as a
text summary (``hparams``); each training record's numbers as scalars ``train/<name>`` at its step; each
evaluation's as ``eval/<name>``; the run's wall time as ``fit/wall_time``. ``ConsoleLogger`` prints one
readable line per training record and per evaluation, through tqdm so that a progress bar stays intact.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from composer_fn.core import validate
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
        validate.integer("flush_secs", flush_secs, minimum=1, hint="seconds")
        self.log_dir = Path(log_dir)
        self._writer: Any = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)

    def log(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "hparams":
            settings = {name: value for name, value in record.items() if name != "kind"}
            text = "\n".join(f"    {line}" for line in json.dumps(settings, indent=2, sort_keys=True).splitlines())
            self._writer.add_text("hparams", text, global_step=0)
            return
        section = _SECTIONS.get(str(kind))
        if section is None:
            return
        step = int(record.get("step", 0))
        for name, value in record.items():
            if name in _POSITION or name == "kind" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            self._writer.add_scalar(f"{section}/{name}", float(value), global_step=step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


class ConsoleLogger(Logger):
    """Prints one line per training record (step, epoch, loss, learning-rate multiplier, throughput) and per
    evaluation (its metrics) to ``stream`` (default: standard error, where the progress bar is)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def log(self, record: dict[str, Any]) -> None:
        line = _line(record)
        if line is None:
            return
        from tqdm import tqdm

        tqdm.write(line, file=self.stream if self.stream is not None else sys.stderr)


def _line(record: dict[str, Any]) -> str | None:
    kind = record.get("kind")
    where = f"[epoch {record.get('epoch', '?')} | batch {record.get('step', '?')}]"
    if kind == "train":
        return (
            f"{where} loss {record['loss']:.4f} | lr × {record['lr_multiplier']:.4g} | "
            f"{record['samples_per_second']:,.0f} samples/s"
        )
    if kind == "eval":
        metrics = [
            f"{name} {value:.2%}" if "accuracy" in name else f"{name} {value:.4f}"
            for name, value in record.items()
            if name not in ("kind", *_POSITION) and isinstance(value, int | float) and not isinstance(value, bool)
        ]
        return f"{where} " + " | ".join(metrics)
    if kind == "fit":
        return f"[done at batch {record.get('step', '?')}] wall time {record.get('wall_time', float('nan')):.1f} s"
    return None
