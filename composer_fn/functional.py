"""The notebook API: every pure function of every algorithm, with Composer's names plus an explicit ``key``."""

from composer_fn.algorithms.channels_last import apply_channels_last, channels_last_tensors
from composer_fn.algorithms.label_smoothing import smooth_labels
from composer_fn.algorithms.mixup import MixUpParams, mixup_apply, mixup_batch, mixup_params, mixup_targets
from composer_fn.algorithms.progressive_resizing import (
    CropParams,
    crop_apply,
    crop_params,
    pinned_size,
    progressive_scale,
    resize_apply,
    resize_batch,
)
from composer_fn.algorithms.selective_backprop import (
    select_indices,
    select_using_loss,
    selection_weights,
    should_selective_backprop,
)

__all__ = [
    "CropParams",
    "MixUpParams",
    "apply_channels_last",
    "channels_last_tensors",
    "crop_apply",
    "crop_params",
    "mixup_apply",
    "mixup_batch",
    "mixup_params",
    "mixup_targets",
    "pinned_size",
    "progressive_scale",
    "resize_apply",
    "resize_batch",
    "select_indices",
    "select_using_loss",
    "selection_weights",
    "should_selective_backprop",
    "smooth_labels",
]
