"""Every algorithm record, registered in ``composer_fn.core.algorithm.REGISTRY``."""

from composer_fn.algorithms.channels_last import ChannelsLast
from composer_fn.algorithms.label_smoothing import LabelSmoothing
from composer_fn.algorithms.mixup import MixUp
from composer_fn.algorithms.progressive_resizing import ProgressiveResizing
from composer_fn.algorithms.selective_backprop import SelectiveBackprop

__all__ = ["ChannelsLast", "LabelSmoothing", "MixUp", "ProgressiveResizing", "SelectiveBackprop"]
