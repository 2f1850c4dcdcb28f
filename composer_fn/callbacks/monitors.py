"""Monitors: callbacks that add numbers to each log step's training record (every ``log_interval``).

Each reads the clock, the run's counters or the process, never the device's tensors between log steps, so a
monitor costs nothing on the batches in between. Their names follow Composer's, so dashboards read alike:

- ``SpeedMonitor``: ``throughput/batches_per_second``, ``throughput/samples_per_second``,
  ``throughput/tokens_per_second`` (token inputs), ``time/step_ms`` over a rolling window of batches, and with
  known FLOPs per sample ``throughput/flops_per_second`` and ``throughput/mfu`` (of ``peak_flops``).
- ``LRMonitor``: ``lr`` (the optimizer's base rate times the schedule's multiplier).
- ``MemoryMonitor``: the CUDA allocator's figures on a GPU (``memory/allocated_bytes``, ``memory/peak_bytes``,
  ``memory/reserved_bytes``, ``memory/alloc_retries``); the process's resident memory on the CPU
  (``memory/rss_bytes``).
- ``RuntimeEstimator``: ``time/remaining_seconds``, the run's estimated time to its end.
- ``SystemMetricsMonitor``: ``sys/cpu_percent``, ``sys/memory_percent``, and disk and network byte counts.
- ``OptimizerMonitor``: ``l2_norm/grad/global`` and ``l2_norm/update/global`` (the step's gradient and the change
  it made to the parameters), and per parameter ``l2_norm/grad/<name>``, ``l2_norm/update/<name>``; the step
  computes them only when this monitor is there.
"""

from __future__ import annotations

import collections
import os
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from composer_fn.callbacks.base import Callback, RunView
from composer_fn.core import validate

__all__ = [
    "LRMonitor",
    "OptimizerMonitor",
    "MemoryMonitor",
    "RuntimeEstimator",
    "SpeedMonitor",
    "SystemMetricsMonitor",
    "measure_flops_per_sample",
]


def measure_flops_per_sample(module: nn.Module, batch: torch.Tensor) -> float:
    """Returns the FLOPs of one training step's forward and backward per sample of ``batch``, counted once by
    ``torch.utils.flop_counter`` (``module``'s ``.grad`` are left as they were; its buffers, such as BatchNorm
    statistics, see one more batch: pass a copy to keep them)."""
    if not isinstance(batch, torch.Tensor) or batch.dim() == 0 or batch.shape[0] == 0:
        raise ValueError(f"batch={batch!r}: expected a tensor holding at least one sample along dim 0")
    from torch.utils.flop_counter import FlopCounterMode

    trainable = [p for p in module.parameters() if p.requires_grad]
    counter = FlopCounterMode(display=False)
    with counter:
        outputs = module(batch)
        # Gradients as a result, not into ``.grad``: the module's own are not touched.
        torch.autograd.grad(outputs.float().sum(), trainable, allow_unused=True)
    return counter.get_total_flops() / batch.shape[0]


_PEAK_FLOPS = {
    # Dense tensor-core peaks (no sparsity), by device-name fragment and compute dtype, in FLOP/s; a longer
    # fragment comes before any it contains ("A100" before "A10", "L40S" before "L4").
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12},
    "L40": {"bf16": 181e12, "fp16": 181e12, "fp32": 90.5e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12},
    "V100": {"fp16": 125e12, "fp32": 15.7e12},
    "T4": {"fp16": 65e12, "fp32": 8.1e12},
}


def _peak_flops(precision: str, device: torch.device) -> float | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    dtype = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(precision, "fp32")
    for fragment, peaks in _PEAK_FLOPS.items():
        if fragment in name:
            return peaks.get(dtype)
    return None


class SpeedMonitor(Callback):
    """Throughput over the last ``window_size`` batches, read at each log step (see the module docstring).

    Args:
        window_size: how many batches the rolling window spans.
        flops_per_sample: the FLOPs of a training step per sample (``measure_flops_per_sample``); None: no
            FLOP figures.
        peak_flops: the device's peak FLOP/s for MFU; None: looked up for known GPUs by the run's precision
            (no MFU on the CPU or an unknown device).
    """

    logs = ("throughput/*", "time/step_ms")

    def __init__(self, window_size: int = 100, flops_per_sample: float | None = None, peak_flops: float | None = None):
        self.window_size = validate.integer("window_size", window_size, minimum=1, hint="batches")
        self.flops_per_sample = (
            None if flops_per_sample is None else validate.real("flops_per_sample", flops_per_sample, minimum=0.0)
        )
        self.peak_flops = (
            None
            if peak_flops is None
            else validate.real("peak_flops", peak_flops, minimum=0.0, open_below=True, hint="FLOP/s")
        )
        self._points: collections.deque[tuple[float, int, int, int]] = collections.deque()
        self._peak: float | None = None

    def fit_start(self, view: RunView) -> None:
        """Starts the window at the run's first step and looks up the device's peak FLOP/s."""
        stamp = view.timestamp
        self._points = collections.deque([(time.perf_counter(), stamp.batch, stamp.sample, stamp.token)])
        self._peak = self.peak_flops if self.peak_flops is not None else _peak_flops(
            view.static.precision, view.static.device
        )

    def log_metrics(self, view: RunView) -> Mapping[str, float]:
        stamp = view.timestamp
        now = (time.perf_counter(), stamp.batch, stamp.sample, stamp.token)
        self._points.append(now)
        while len(self._points) > 2 and now[1] - self._points[1][1] >= self.window_size:
            self._points.popleft()
        then = self._points[0]
        seconds, batches = now[0] - then[0], now[1] - then[1]
        if seconds <= 0 or batches <= 0:
            return {}
        samples_per_second = (now[2] - then[2]) / seconds
        values = {
            "throughput/batches_per_second": batches / seconds,
            "throughput/samples_per_second": samples_per_second,
            "time/step_ms": 1e3 * seconds / batches,
        }
        if now[3] > then[3]:
            values["throughput/tokens_per_second"] = (now[3] - then[3]) / seconds
        if self.flops_per_sample is not None:
            flops = samples_per_second * self.flops_per_sample
            values["throughput/flops_per_second"] = flops
            if self._peak:
                values["throughput/mfu"] = flops / self._peak
        return values


class LRMonitor(Callback):
    """Logs ``lr``: the optimizer's base learning rate times the schedule's multiplier at the log step (the
    multiplier alone, as ``lr_multiplier``, is in every training record)."""

    logs = ("lr",)

    def log_metrics(self, view: RunView) -> Mapping[str, float]:
        multiplier = view.metrics.get("lr_multiplier")
        if view.base_learning_rate is None or multiplier is None:
            return {}
        return {"lr": view.base_learning_rate * multiplier}


class MemoryMonitor(Callback):
    """Logs the CUDA allocator's current, peak and reserved bytes and its retries on a GPU, or the process's
    resident memory on the CPU: on Linux the kernel's count (``/proc/self/statm``, the figure psutil reports),
    read through a descriptor kept open for the run; elsewhere psutil's."""

    logs = ("memory/*",)

    def __init__(self) -> None:
        self._rss: Callable[[], float] | None = None
        self._descriptor: int | None = None

    def log_metrics(self, view: RunView) -> Mapping[str, float]:
        device = view.static.device
        if device.type == "cuda":
            stats = torch.cuda.memory_stats(device)
            return {
                "memory/allocated_bytes": float(stats.get("allocated_bytes.all.current", 0)),
                "memory/peak_bytes": float(stats.get("allocated_bytes.all.peak", 0)),
                "memory/reserved_bytes": float(stats.get("reserved_bytes.all.current", 0)),
                "memory/alloc_retries": float(stats.get("num_alloc_retries", 0)),
            }
        if self._rss is None:
            self._rss = self._rss_reader()
        return {"memory/rss_bytes": self._rss()}

    def _rss_reader(self) -> Callable[[], float]:
        # Opened by the process that trains (the first log step), not the one that built the monitor.
        try:
            descriptor = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            import psutil

            process = psutil.Process()
            return lambda: float(process.memory_info().rss)
        self._descriptor, page = descriptor, os.sysconf("SC_PAGE_SIZE")
        # Opening the file costs most of a read: psutil opens it at each one.
        return lambda: float(int(os.pread(descriptor, 256, 0).split()[1]) * page)

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
        self._rss = self._descriptor = None


class RuntimeEstimator(Callback):
    """Logs ``time/remaining_seconds``: the wall time per batch so far (evaluations and checkpoints included)
    times the batches left.

    Args:
        skip_batches: batches not counted at the start of each ``fit`` (compilation, warm-up).
    """

    logs = ("time/remaining_seconds",)

    def __init__(self, skip_batches: int = 1) -> None:
        self.skip_batches = validate.integer("skip_batches", skip_batches, minimum=0, hint="batches")
        self._start: tuple[float, int] | None = None
        self._first = 0

    def fit_start(self, view: RunView) -> None:
        """Notes the step ``fit`` starts from; the clock starts ``skip_batches`` later. Warns when that leaves no
        batch to measure: the estimate would never be logged."""
        self._start, self._first = None, view.timestamp.batch
        remaining = view.max_steps - view.timestamp.batch
        if 0 < remaining <= self.skip_batches:
            warnings.warn(
                f"RuntimeEstimator(skip_batches={self.skip_batches}) skips at least the {remaining} batches this run "
                "trains, so it never logs time/remaining_seconds; pass a smaller skip_batches",
                UserWarning,
                stacklevel=2,
            )

    def log_metrics(self, view: RunView) -> Mapping[str, float]:
        # The clock starts at the first log step past the skipped batches (nothing runs on the batches between).
        if self._start is None:
            if view.timestamp.batch - self._first >= self.skip_batches:
                self._start = (time.perf_counter(), view.timestamp.batch)
            return {}
        if view.timestamp.batch <= self._start[1]:
            return {}
        began, batch = self._start
        per_batch = (time.perf_counter() - began) / (view.timestamp.batch - batch)
        return {"time/remaining_seconds": per_batch * max(view.max_steps - view.timestamp.batch, 0)}


class SystemMetricsMonitor(Callback):
    """Logs the machine's CPU and memory use and its disk and network byte counts since the run started
    (psutil)."""

    logs = ("sys/*",)

    def __init__(self) -> None:
        self._base: dict[str, float] = {}

    def fit_start(self, view: RunView) -> None:
        """Reads the disk and network counters the logged byte counts start from."""
        import psutil

        psutil.cpu_percent(interval=None)  # the first reading starts psutil's interval
        self._base = self._counters()

    def log_metrics(self, view: RunView) -> Mapping[str, float]:
        import psutil

        values = {
            "sys/cpu_percent": float(psutil.cpu_percent(interval=None)),
            "sys/memory_percent": float(psutil.virtual_memory().percent),
        }
        for name, value in self._counters().items():
            values[f"sys/{name}"] = value - self._base.get(name, 0.0)
        return values

    @staticmethod
    def _counters() -> dict[str, float]:
        import psutil

        counters: dict[str, Any] = {}
        disk, network = psutil.disk_io_counters(), psutil.net_io_counters()
        if disk is not None:
            counters.update(disk_read_bytes=disk.read_bytes, disk_write_bytes=disk.write_bytes)
        if network is not None:
            counters.update(network_sent_bytes=network.bytes_sent, network_received_bytes=network.bytes_recv)
        return {name: float(value) for name, value in counters.items()}


class OptimizerMonitor(Callback):
    """Logs the L2 norms of the step's gradient and parameter update, over all parameters and, with
    ``per_layer``, for each (Composer's ``OptimizerMonitor``), as of the log step's training step.

    Args:
        per_layer: also log each parameter's norms (``l2_norm/grad/<name>``).
    """

    step_norms = True
    logs = ("l2_norm/*",)

    def __init__(self, per_layer: bool = True) -> None:
        self.per_layer = validate.flag("per_layer", per_layer)

    def log_metrics(self, view: RunView) -> Mapping[str, float]:
        return {
            name: value
            for name, value in view.metrics.items()
            if name.startswith("l2_norm/") and (self.per_layer or name.endswith("/global"))
        }
