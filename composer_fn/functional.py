"""The notebook API: every pure function of every algorithm, with Composer's names plus an explicit ``key``."""

from composer_fn.algorithms.channels_last import apply_channels_last, channels_last_tensors
from composer_fn.algorithms.label_smoothing import smooth_labels
from composer_fn.algorithms.mixup import MixUpParams, mixup_apply, mixup_batch, mixup_params, mixup_targets

__all__ = [
    "MixUpParams",
    "apply_channels_last",
    "channels_last_tensors",
    "mixup_apply",
    "mixup_batch",
    "mixup_params",
    "mixup_targets",
    "smooth_labels",
]
