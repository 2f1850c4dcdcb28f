"""Destinations for logged metrics: TensorBoard, the console, a JSON-lines file and an in-memory list."""

from composer_fn.loggers.base import InMemoryLogger, JSONLLogger, Logger
from composer_fn.loggers.tensorboard import ConsoleLogger, TensorBoardLogger

__all__ = ["ConsoleLogger", "InMemoryLogger", "JSONLLogger", "Logger", "TensorBoardLogger"]
