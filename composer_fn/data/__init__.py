"""Data: the embedded digits task, keyed synthetic images, and an in-memory loader."""

from composer_fn.data.digits import DigitsTask, load_digits_task
from composer_fn.data.loader import TensorLoader
from composer_fn.data.synthetic import synthetic_images

__all__ = ["DigitsTask", "TensorLoader", "load_digits_task", "synthetic_images"]
