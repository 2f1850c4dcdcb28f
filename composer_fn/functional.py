"""The notebook API: every pure function of every algorithm, with Composer's names plus an explicit ``key``."""

from composer_fn.algorithms.alibi import (
    alibi_slopes,
    apply_alibi,
    scale_batch_sequence_length,
    scaled_sequence_length,
)
from composer_fn.algorithms.augmix import (
    AugMixParams,
    augmix_apply,
    augmix_batch,
    augmix_image,
    augmix_params,
)
from composer_fn.algorithms.blurpool import apply_blurpool, blur_2d, blurmax_pool2d
from composer_fn.algorithms.channels_last import apply_channels_last, channels_last_tensors
from composer_fn.algorithms.colout import ColOutParams, colout_apply, colout_batch, colout_params
from composer_fn.algorithms.cutmix import (
    CutMixParams,
    cutmix_apply,
    cutmix_batch,
    cutmix_params,
    cutmix_targets,
)
from composer_fn.algorithms.cutout import CutOutParams, cutout_apply, cutout_batch, cutout_params
from composer_fn.algorithms.ema import compute_ema, ema_update
from composer_fn.algorithms.factorize import (
    LowRankSolution,
    apply_factorization,
    factorize_conv2d,
    factorize_matrix,
)
from composer_fn.algorithms.gated_linear_units import apply_gated_linear_units, feed_forward_parameter_change
from composer_fn.algorithms.ghost_batchnorm import apply_ghost_batchnorm
from composer_fn.algorithms.gradient_clipping import apply_gradient_clipping
from composer_fn.algorithms.gyro_dropout import apply_gyro_dropout, gyro_dropout_masks
from composer_fn.algorithms.label_smoothing import smooth_labels, smoothing_term
from composer_fn.algorithms.layer_freezing import freezable_layers, freeze_layers, freeze_schedule
from composer_fn.algorithms.low_precision_groupnorm import apply_low_precision_groupnorm
from composer_fn.algorithms.low_precision_layernorm import apply_low_precision_layernorm
from composer_fn.algorithms.mixup import MixUpParams, mixup_apply, mixup_batch, mixup_params, mixup_targets
from composer_fn.algorithms.progressive_resizing import (
    CropParams,
    crop_apply,
    crop_params,
    fixed_input_size,
    pinned_size,
    progressive_scale,
    resize_apply,
    resize_batch,
)
from composer_fn.algorithms.randaugment import (
    RandAugmentParams,
    randaugment_apply,
    randaugment_batch,
    randaugment_image,
    randaugment_params,
)
from composer_fn.algorithms.random_crop_flip import (
    RandomCropFlipParams,
    random_crop_flip_apply,
    random_crop_flip_batch,
    random_crop_flip_params,
)
from composer_fn.algorithms.sam import sam_gradients, sam_perturbation
from composer_fn.algorithms.selective_backprop import (
    select_indices,
    select_using_loss,
    selection_weights,
    should_selective_backprop,
)
from composer_fn.algorithms.seq_length_warmup import set_batch_sequence_length, warmup_sequence_length
from composer_fn.algorithms.squeeze_excite import apply_squeeze_excite
from composer_fn.algorithms.stochastic_depth import apply_stochastic_depth, drop_rates, warmup_factor
from composer_fn.algorithms.swa import recompute_batchnorm, swa_update
from composer_fn.algorithms.weight_standardization import apply_weight_standardization, standardize_weight

__all__ = [
    "apply_blurpool",
    "blur_2d",
    "blurmax_pool2d",
    "apply_squeeze_excite",
    "apply_stochastic_depth",
    "drop_rates",
    "warmup_factor",
    "LowRankSolution",
    "apply_factorization",
    "factorize_conv2d",
    "factorize_matrix",
    "apply_ghost_batchnorm",
    "apply_gyro_dropout",
    "gyro_dropout_masks",
    "apply_low_precision_groupnorm",
    "apply_weight_standardization",
    "standardize_weight",
    "alibi_slopes",
    "apply_alibi",
    "scale_batch_sequence_length",
    "scaled_sequence_length",
    "apply_gated_linear_units",
    "feed_forward_parameter_change",
    "apply_low_precision_layernorm",
    "AugMixParams",
    "ColOutParams",
    "CropParams",
    "CutMixParams",
    "CutOutParams",
    "MixUpParams",
    "RandAugmentParams",
    "RandomCropFlipParams",
    "apply_channels_last",
    "apply_gradient_clipping",
    "augmix_apply",
    "augmix_batch",
    "augmix_image",
    "augmix_params",
    "channels_last_tensors",
    "colout_apply",
    "colout_batch",
    "colout_params",
    "compute_ema",
    "freezable_layers",
    "freeze_layers",
    "freeze_schedule",
    "recompute_batchnorm",
    "swa_update",
    "crop_apply",
    "crop_params",
    "cutmix_apply",
    "cutmix_batch",
    "cutmix_params",
    "cutmix_targets",
    "cutout_apply",
    "cutout_batch",
    "cutout_params",
    "ema_update",
    "mixup_apply",
    "mixup_batch",
    "mixup_params",
    "mixup_targets",
    "fixed_input_size",
    "pinned_size",
    "progressive_scale",
    "random_crop_flip_apply",
    "random_crop_flip_batch",
    "random_crop_flip_params",
    "randaugment_apply",
    "randaugment_batch",
    "randaugment_image",
    "randaugment_params",
    "resize_apply",
    "resize_batch",
    "sam_gradients",
    "sam_perturbation",
    "select_indices",
    "select_using_loss",
    "selection_weights",
    "should_selective_backprop",
    "set_batch_sequence_length",
    "smooth_labels",
    "smoothing_term",
    "warmup_sequence_length",
]
