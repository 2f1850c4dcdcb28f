"""composer_fn: faster training by composing speed-up methods as pure functions over immutable state.

The public surface: ``Trainer``; the records ``State``, ``StepCtx``, ``Static``; ``Event``, ``Time``,
``Timestamp``; the algorithm records; ``functional`` (the notebook API); ``optim``; ``random`` (keys).
"""

from composer_fn import functional, optim
from composer_fn.algorithms import (
    EMA,
    SAM,
    SWA,
    Alibi,
    AugMix,
    BlurPool,
    ChannelsLast,
    ColOut,
    CutMix,
    CutOut,
    Factorize,
    GatedLinearUnits,
    GhostBatchNorm,
    GradientClipping,
    GyroDropout,
    LabelSmoothing,
    LayerFreezing,
    LowPrecisionGroupNorm,
    LowPrecisionLayerNorm,
    MixUp,
    ProgressiveResizing,
    RandAugment,
    SelectiveBackprop,
    SeqLengthWarmup,
    SqueezeExcite,
    StochasticDepth,
    WeightStandardization,
)
from composer_fn.core import random
from composer_fn.core.algorithm import Algorithm
from composer_fn.core.engine import dry_run, make_plan, run_event
from composer_fn.core.event import Event
from composer_fn.core.state import State, Static, StepCtx
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.trainer import Trainer

__all__ = [
    "BlurPool",
    "SqueezeExcite",
    "StochasticDepth",
    "Factorize",
    "GhostBatchNorm",
    "GyroDropout",
    "LowPrecisionGroupNorm",
    "WeightStandardization",
    "Alibi",
    "GatedLinearUnits",
    "LowPrecisionLayerNorm",
    "Algorithm",
    "AugMix",
    "ChannelsLast",
    "ColOut",
    "CutMix",
    "CutOut",
    "EMA",
    "Event",
    "GradientClipping",
    "LabelSmoothing",
    "LayerFreezing",
    "MixUp",
    "ProgressiveResizing",
    "RandAugment",
    "SAM",
    "SelectiveBackprop",
    "SeqLengthWarmup",
    "SWA",
    "State",
    "Static",
    "StepCtx",
    "Time",
    "TimeUnit",
    "Timestamp",
    "Trainer",
    "dry_run",
    "functional",
    "make_plan",
    "optim",
    "random",
    "run_event",
]
