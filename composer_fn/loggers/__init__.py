"""Destinations for logged metrics: TensorBoard, the console, a JSON-lines file, an in-memory list, and the
experiment trackers Weights & Biases and MLflow (whose packages are imported only when such a logger is made)."""

from composer_fn.loggers.base import InMemoryLogger, JSONLLogger, Logger
from composer_fn.loggers.mlflow import MLFlowLogger
from composer_fn.loggers.tensorboard import ConsoleLogger, TensorBoardLogger
from composer_fn.loggers.wandb import WandBLogger

__all__ = ["ConsoleLogger", "InMemoryLogger", "JSONLLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandBLogger"]
