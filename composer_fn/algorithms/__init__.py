"""Every algorithm record, registered in ``composer_fn.core.algorithm.REGISTRY``."""

from composer_fn.algorithms.alibi import Alibi
from composer_fn.algorithms.augmix import AugMix
from composer_fn.algorithms.blurpool import BlurPool
from composer_fn.algorithms.channels_last import ChannelsLast
from composer_fn.algorithms.colout import ColOut
from composer_fn.algorithms.cutmix import CutMix
from composer_fn.algorithms.cutout import CutOut
from composer_fn.algorithms.ema import EMA
from composer_fn.algorithms.factorize import Factorize
from composer_fn.algorithms.gated_linear_units import GatedLinearUnits
from composer_fn.algorithms.ghost_batchnorm import GhostBatchNorm
from composer_fn.algorithms.gradient_clipping import GradientClipping
from composer_fn.algorithms.gyro_dropout import GyroDropout
from composer_fn.algorithms.label_smoothing import LabelSmoothing
from composer_fn.algorithms.layer_freezing import LayerFreezing
from composer_fn.algorithms.low_precision_groupnorm import LowPrecisionGroupNorm
from composer_fn.algorithms.low_precision_layernorm import LowPrecisionLayerNorm
from composer_fn.algorithms.mixup import MixUp
from composer_fn.algorithms.progressive_resizing import ProgressiveResizing
from composer_fn.algorithms.randaugment import RandAugment
from composer_fn.algorithms.random_crop_flip import RandomCropFlip
from composer_fn.algorithms.sam import SAM
from composer_fn.algorithms.selective_backprop import SelectiveBackprop
from composer_fn.algorithms.seq_length_warmup import SeqLengthWarmup
from composer_fn.algorithms.squeeze_excite import SqueezeExcite
from composer_fn.algorithms.stochastic_depth import StochasticDepth
from composer_fn.algorithms.stopping import EarlyStopper, ThresholdStopper
from composer_fn.algorithms.swa import SWA
from composer_fn.algorithms.weight_standardization import WeightStandardization

__all__ = [
    "Alibi",
    "AugMix",
    "BlurPool",
    "ChannelsLast",
    "ColOut",
    "CutMix",
    "CutOut",
    "EarlyStopper",
    "EMA",
    "Factorize",
    "GatedLinearUnits",
    "GhostBatchNorm",
    "GradientClipping",
    "GyroDropout",
    "LabelSmoothing",
    "LayerFreezing",
    "LowPrecisionGroupNorm",
    "LowPrecisionLayerNorm",
    "MixUp",
    "ProgressiveResizing",
    "RandAugment",
    "RandomCropFlip",
    "SAM",
    "SelectiveBackprop",
    "SeqLengthWarmup",
    "SqueezeExcite",
    "StochasticDepth",
    "SWA",
    "ThresholdStopper",
    "WeightStandardization",
]
