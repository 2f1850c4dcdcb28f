"""Models: a small model zoo and keyed parameter initialisation."""

from composer_fn.models.cnn import SmallCNN
from composer_fn.models.init import init_parameters
from composer_fn.models.mlp import MLP

__all__ = ["MLP", "SmallCNN", "init_parameters"]
