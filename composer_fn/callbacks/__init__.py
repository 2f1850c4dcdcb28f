"""Observers of training: they receive a read-only view of the run at each event and change nothing."""

from composer_fn.callbacks.base import Callback, RunView
from composer_fn.callbacks.monitors import (
    LRMonitor,
    MemoryMonitor,
    OptimizerMonitor,
    RuntimeEstimator,
    SpeedMonitor,
    SystemMetricsMonitor,
    measure_flops_per_sample,
)
from composer_fn.callbacks.nan_monitor import NaNMonitor

__all__ = [
    "Callback",
    "LRMonitor",
    "MemoryMonitor",
    "NaNMonitor",
    "OptimizerMonitor",
    "RunView",
    "RuntimeEstimator",
    "SpeedMonitor",
    "SystemMetricsMonitor",
    "measure_flops_per_sample",
]
