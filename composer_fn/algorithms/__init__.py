"""Every algorithm record, registered in ``composer_fn.core.algorithm.REGISTRY``."""

from composer_fn.algorithms.alibi import Alibi
from composer_fn.algorithms.augmix import AugMix
from composer_fn.algorithms.channels_last import ChannelsLast
from composer_fn.algorithms.colout import ColOut
from composer_fn.algorithms.cutmix import CutMix
from composer_fn.algorithms.cutout import CutOut
from composer_fn.algorithms.ema import EMA
from composer_fn.algorithms.gated_linear_units import GatedLinearUnits
from composer_fn.algorithms.gradient_clipping import GradientClipping
from composer_fn.algorithms.label_smoothing import LabelSmoothing
from composer_fn.algorithms.layer_freezing import LayerFreezing
from composer_fn.algorithms.low_precision_layernorm import LowPrecisionLayerNorm
from composer_fn.algorithms.mixup import MixUp
from composer_fn.algorithms.progressive_resizing import ProgressiveResizing
from composer_fn.algorithms.randaugment import RandAugment
from composer_fn.algorithms.sam import SAM
from composer_fn.algorithms.selective_backprop import SelectiveBackprop
from composer_fn.algorithms.seq_length_warmup import SeqLengthWarmup
from composer_fn.algorithms.swa import SWA

__all__ = [
    "Alibi",
    "AugMix",
    "ChannelsLast",
    "ColOut",
    "CutMix",
    "CutOut",
    "EMA",
    "GatedLinearUnits",
    "GradientClipping",
    "LabelSmoothing",
    "LayerFreezing",
    "LowPrecisionLayerNorm",
    "MixUp",
    "ProgressiveResizing",
    "RandAugment",
    "SAM",
    "SelectiveBackprop",
    "SeqLengthWarmup",
    "SWA",
]
