"""Destinations for logged metrics: a JSON-lines file and an in-memory list."""

from composer_fn.loggers.base import InMemoryLogger, JSONLLogger, Logger

__all__ = ["InMemoryLogger", "JSONLLogger", "Logger"]
