"""Edges of the functional API and the algorithm records: a bad argument is refused before any data is touched,
naming the argument, the value and what is accepted; a setting that makes a method do nothing warns once; NumPy
numbers are numbers."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import composer_fn.functional as F
from composer_fn import Trainer, optim
from composer_fn import algorithms as A
from composer_fn.core import random as R
from composer_fn.data import TensorLoader
from composer_fn.models import CausalLM
from composer_fn.models.lm import causal_lm_loss
from composer_fn.nn import forward_keys

KEY = R.key(0)
IMAGES = torch.rand(4, 3, 8, 8)
LABELS = torch.tensor([0, 1, 2, 0])
LOGITS = torch.randn(4, 3)
INDICES = torch.arange(4)
TOKENS = torch.zeros(4, 16, dtype=torch.long)


def _norm_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))


def _per_sample_cross_entropy(outputs: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return torch.nn.functional.cross_entropy(outputs, target, reduction=reduction)


_LINEAR = nn.Sequential(nn.Flatten(), nn.Linear(192, 3))
_NAN = float("nan")


BAD_INPUTS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # label mixing
    ("mixup_batch num_classes=0", lambda: F.mixup_batch(IMAGES, LABELS, key=KEY, num_classes=0), ValueError,
     r"num_classes=0 must be an int >= 1"),
    ("mixup_batch num_classes=2.5", lambda: F.mixup_batch(IMAGES, LABELS, key=KEY, num_classes=2.5), ValueError,
     r"num_classes=2.5 must be an int >= 1"),
    ("mixup_batch lengths", lambda: F.mixup_batch(IMAGES, LABELS[:3], key=KEY, num_classes=3), ValueError,
     r"target of shape \(3,\) does not fit input of shape \(4, 3, 8, 8\): expected one target per example, 4"),
    ("mixup_batch empty", lambda: F.mixup_batch(IMAGES[:0], LABELS[:0], key=KEY, num_classes=3), ValueError,
     r"input of shape \(0, 3, 8, 8\) holds no examples"),
    ("mixup_targets num_classes=-1", lambda: F.mixup_targets(LABELS, INDICES, 0.2, -1), ValueError,
     r"num_classes=-1 must be an int >= 1"),
    ("mixup_targets indices", lambda: F.mixup_targets(LABELS, INDICES[:3], 0.2, 3), ValueError,
     r"indices of shape \(3,\): expected \(4,\), one partner per example of target"),
    ("mixup_targets mixing=2", lambda: F.mixup_targets(LABELS, INDICES, 2.0, 3), ValueError,
     r"mixing=2.0 must be a finite number in \[0, 1\]"),
    ("mixup_apply float indices", lambda: F.mixup_apply(IMAGES, INDICES.float(), 0.2), TypeError,
     r"indices of dtype torch.float32: expected an int64 tensor"),
    ("mixup_params batch_size=2.5", lambda: F.mixup_params(KEY, 2.5), ValueError, r"batch_size=2.5 must be an int"),
    ("MixUp input_key=1.5", lambda: A.MixUp(input_key=1.5), TypeError, r"input_key=1.5 must be a position"),
    ("cutmix_batch lengths", lambda: F.cutmix_batch(IMAGES, LABELS[:3], key=KEY, num_classes=3), ValueError,
     r"target of shape \(3,\) does not fit input of shape \(4, 3, 8, 8\)"),
    ("cutmix_batch num_classes=0", lambda: F.cutmix_batch(IMAGES, LABELS, key=KEY, num_classes=0), ValueError,
     r"num_classes=0 must be an int >= 1"),
    ("cutmix_targets num_classes=-1", lambda: F.cutmix_targets(LABELS, F.cutmix_params(KEY, 4, 8, 8), -1),
     ValueError, r"num_classes=-1 must be an int >= 1"),
    ("cutmix_targets lengths", lambda: F.cutmix_targets(LABELS[:3], F.cutmix_params(KEY, 4, 8, 8), 3), ValueError,
     r"indices of shape \(4,\): expected \(3,\), one partner per example of target"),
    ("cutmix_params height=2.5", lambda: F.cutmix_params(KEY, 4, 2.5, 8), ValueError, r"height=2.5 must be an int"),
    ("smooth_labels smoothing [2]", lambda: F.smooth_labels(LOGITS, LABELS, torch.tensor([0.1, 0.2])), ValueError,
     r"smoothing of shape \(2,\): expected a number or a 0-d tensor"),
    # selective backprop
    ("select_using_loss lengths", lambda: F.select_using_loss(IMAGES, LABELS[:3], _LINEAR, _per_sample_cross_entropy,
     key=KEY), ValueError, r"target of shape \(3,\) does not fit input of shape \(4, 3, 8, 8\)"),
    ("select_using_loss empty", lambda: F.select_using_loss(IMAGES[:0], LABELS[:0], _LINEAR,
     _per_sample_cross_entropy, key=KEY), ValueError, r"input of shape \(0, 3, 8, 8\) holds no examples"),
    ("select_using_loss model", lambda: F.select_using_loss(IMAGES, LABELS, 3, _per_sample_cross_entropy, key=KEY),
     TypeError, r"model=3 must be callable"),
    ("select_indices empty", lambda: F.select_indices(KEY, torch.zeros(0), 0.5), ValueError,
     r"losses of shape \(0,\): expected one loss per sample, \[N\] with N >= 1"),
    ("selection_weights batch_size=0", lambda: F.selection_weights(0, 0.5), ValueError, r"batch_size=0 must be"),
    ("should_selective_backprop start>end", lambda: F.should_selective_backprop(0.6, 0, start=0.9, end=0.5),
     ValueError, r"start=0.9, end=0.5: expected 0 <= start <= end <= 1"),
    ("should_selective_backprop interrupt=-1", lambda: F.should_selective_backprop(0.6, 0, interrupt=-1),
     ValueError, r"interrupt=-1 must be an int >= 0"),
    ("SelectiveBackprop start='a'", lambda: A.SelectiveBackprop(start="a"), ValueError,
     r"start='a' must be a finite number in \[0, 1\]"),
    # colout
    ("colout_batch 8 inputs 5 targets", lambda: F.colout_batch((torch.rand(8, 3, 8, 8), torch.zeros(5)), key=KEY),
     ValueError, r"target of shape \(5,\) does not fit its input of shape \(8, 3, 8, 8\)"),
    ("colout_batch 2-D", lambda: F.colout_batch(torch.rand(8, 8), key=KEY), ValueError,
     r"input of shape \(8, 8\): expected one image \[C, H, W\] or a batch \[N, C, H, W\]"),
    ("colout_params height=0", lambda: F.colout_params(KEY, 0, 8), ValueError, r"height=0 must be an int >= 1"),
    ("colout_params p_row=1", lambda: F.colout_params(KEY, 8, 8, p_row=1.0), ValueError,
     r"p_row=1.0 must be a finite number in \[0, 1\)"),
    ("colout_apply params of a larger image", lambda: F.colout_apply(torch.rand(3, 4, 4), F.colout_params(KEY, 8, 8)),
     ValueError, r"params.rows holds index \d, outside input of shape \(3, 4, 4\)"),
    # progressive resizing
    ("pinned_size scale=0", lambda: F.pinned_size(8, 8, 0), ValueError, r"scale=0 must be a finite number > 0"),
    ("pinned_size size_increment=0", lambda: F.pinned_size(8, 8, 0.5, 0), ValueError, r"size_increment=0 must be"),
    ("pinned_size width=0", lambda: F.pinned_size(8, 0, 0.5), ValueError, r"width=0 must be an int >= 1"),
    ("progressive_scale elapsed=2", lambda: F.progressive_scale(2.0), ValueError, r"elapsed=2.0 must be"),
    ("resize_apply height=0", lambda: F.resize_apply(IMAGES, 0, 4), ValueError, r"height=0 must be an int >= 1"),
    ("resize_apply 2-D", lambda: F.resize_apply(torch.rand(8, 8), 4, 4), ValueError, r"images of shape \(8, 8\)"),
    ("resize_batch target lengths", lambda: F.resize_batch(IMAGES, torch.zeros(3, 8, 8), 0.5, resize_targets=True),
     ValueError, r"target of shape \(3, 8, 8\) does not fit input of shape \(4, 3, 8, 8\)"),
    ("crop_apply crop_height=0", lambda: F.crop_apply(IMAGES, F.crop_params(KEY, 8, 8, 4, 4), 0, 4), ValueError,
     r"crop_height=0 must be an int in \[1, 8\]"),
    ("ProgressiveResizing delay_fraction='a'", lambda: A.ProgressiveResizing(delay_fraction="a"), ValueError,
     r"delay_fraction='a' must be a finite number"),
    # blurpool
    ("blur_2d stride=0", lambda: F.blur_2d(IMAGES, stride=0), ValueError, r"stride=0 must be an int >= 1"),
    ("blur_2d stride=(1, 0)", lambda: F.blur_2d(IMAGES, stride=(1, 0)), ValueError, r"stride=\(1, 0\) must be"),
    ("blur_2d integer input", lambda: F.blur_2d(torch.ones(1, 1, 4, 4, dtype=torch.long)), TypeError,
     r"input of dtype torch.int64: blurring needs floating-point images \(float32, float16, bfloat16 or float64\)"),
    ("blurmax_pool2d kernel_size=0", lambda: F.blurmax_pool2d(IMAGES, 0), ValueError, r"kernel_size=0 must be"),
    ("blurmax_pool2d dilation=0", lambda: F.blurmax_pool2d(IMAGES, 2, dilation=0), ValueError, r"dilation=0 must"),
    ("blurmax_pool2d padding=-1", lambda: F.blurmax_pool2d(IMAGES, 2, padding=-1), ValueError, r"padding=-1 must"),
    ("blurmax_pool2d padding too wide", lambda: F.blurmax_pool2d(IMAGES, 2, padding=2), ValueError,
     r"padding=\(2, 2\) exceeds half the pooling window"),
    ("blurmax_pool2d kernel beyond image", lambda: F.blurmax_pool2d(IMAGES, 9), ValueError,
     r"kernel_size=\(9, 9\) with dilation=\(1, 1\) spans 9 pixels, more than the input's height of 8"),
    ("BlurMaxPool2d kernel_size=0", lambda: A.blurpool.BlurMaxPool2d(0), ValueError, r"kernel_size=0 must be"),
    # factorize
    ("factorize_matrix NaN X", lambda: F.factorize_matrix(torch.full((8, 4), _NAN), torch.rand(8, 4),
     torch.rand(4, 4), rank=1), ValueError, r"X of shape \(8, 4\) holds non-finite values"),
    ("factorize_matrix inf Wa", lambda: F.factorize_matrix(torch.rand(8, 4), torch.rand(8, 4),
     torch.full((4, 4), float("inf")), rank=1), ValueError, r"Wa of shape \(4, 4\) holds non-finite values"),
    ("factorize_matrix bias", lambda: F.factorize_matrix(torch.rand(8, 4), torch.rand(8, 4), torch.rand(4, 4),
     bias=torch.rand(3), rank=1), ValueError, r"bias \(3,\) must hold one value per column of Y: \(4,\)"),
    ("factorize_matrix integer X", lambda: F.factorize_matrix(torch.ones(8, 4, dtype=torch.long), torch.rand(8, 4),
     torch.rand(4, 4), rank=1), TypeError, r"X of dtype torch.int64: expected a floating-point tensor"),
    ("factorize_conv2d Wb", lambda: F.factorize_conv2d(torch.rand(2, 4, 5, 5), torch.rand(4, 4, 3, 3),
     Wb=torch.rand(4, 3, 1, 1), rank=1), ValueError, r"Wb \(4, 3, 1, 1\) must be a 1x1 convolution"),
    ("factorize_conv2d dilation=0", lambda: F.factorize_conv2d(torch.rand(2, 4, 5, 5), torch.rand(4, 4, 3, 3),
     rank=1, dilation=0), ValueError, r"dilation=0 must be an int >= 1"),
    ("factorize_conv2d kernel beyond image", lambda: F.factorize_conv2d(torch.rand(2, 4, 2, 2),
     torch.rand(4, 4, 3, 3), rank=1), ValueError, r"X of shape \(2, 4, 2, 2\) is smaller than the kernel"),
    # sam, ema, swa
    ("sam_perturbation({})", lambda: F.sam_perturbation({}), ValueError, r"grads=\{\}: expected at least one"),
    ("sam_perturbation float", lambda: F.sam_perturbation({"w": 1.0}), TypeError,
     r"grads\['w'\] of type float: expected a floating-point tensor"),
    ("sam_gradients unknown name", lambda: F.sam_gradients({"w": torch.ones(2)}, {"v": torch.ones(2)},
     lambda p: (torch.zeros(()), p)), ValueError, r"grads holds \['v'\], which params does not"),
    ("sam_gradients shapes", lambda: F.sam_gradients({"w": torch.ones(2)}, {"w": torch.ones(3)},
     lambda p: (torch.zeros(()), p)), ValueError, r"grads\['w'\] of shape \(3,\) does not fit params\['w'\]"),
    ("compute_ema shapes", lambda: F.compute_ema({"w": torch.ones(2)}, {"w": torch.ones(3)}), ValueError,
     r"ema_model\['w'\] \(\(3,\), torch.float32, cpu\) and model\['w'\] \(\(2,\), torch.float32, cpu\) must have"),
    ("compute_ema dtypes", lambda: F.compute_ema({"w": torch.ones(2)}, {"w": torch.ones(2, dtype=torch.float64)}),
     ValueError, r"must have the same shape, dtype and device"),
    ("compute_ema keys", lambda: F.compute_ema({"w": torch.ones(2)}, {"w": torch.ones(2), "v": torch.ones(2)}),
     ValueError, r"ema_model and model must hold the same names: \[\] only in model, \['v'\] only in ema_model"),
    ("ema_update shapes", lambda: F.ema_update({"w": torch.ones(2)}, {"w": torch.ones(3)}, 0.9), ValueError,
     r"average\['w'\] \(\(2,\), torch.float32, cpu\) and params\['w'\]"),
    ("swa_update shapes", lambda: F.swa_update({"w": torch.ones(2)}, {"w": torch.ones(3)}, 1), ValueError,
     r"average\['w'\] \(\(2,\), torch.float32\) and params\['w'\] \(\(3,\), torch.float32\)"),
    ("recompute_batchnorm unknown params", lambda: F.recompute_batchnorm(_norm_model(), {"zzz": torch.ones(1)}, {},
     [IMAGES]), ValueError, r"params holds \['zzz'\], which module Sequential does not have"),
    ("recompute_batchnorm module=3", lambda: F.recompute_batchnorm(3, {}, {}, [IMAGES]), TypeError,
     r"module of type int: expected a torch.nn.Module"),
    # layer freezing, stochastic depth, gated linear units, ghost batchnorm, gyro dropout, alibi
    ("freeze_schedule(-0.5)", lambda: F.freeze_schedule(-0.5), ValueError, r"current_duration=-0.5 must be"),
    ("freeze_schedule freeze_start=1", lambda: F.freeze_schedule(0.5, freeze_start=1.0), ValueError,
     r"freeze_start=1.0 must be a finite number in \[0, 1\)"),
    ("freeze_layers freeze_level=2", lambda: F.freeze_layers(_norm_model(), 0.9, freeze_level=2), ValueError,
     r"freeze_level=2 must be a finite number in \[0, 1\]"),
    ("freezable_layers model=3", lambda: F.freezable_layers(3), TypeError, r"model of type int"),
    ("drop_rates count=-1", lambda: F.drop_rates(0.2, -1), ValueError, r"count=-1 must be an int >= 0"),
    ("drop_rates count=2.5", lambda: F.drop_rates(0.2, 2.5), ValueError, r"count=2.5 must be an int >= 0"),
    ("warmup_factor timestamp=3", lambda: F.warmup_factor(0.1, 3), TypeError, r"timestamp of type int"),
    ("feed_forward_parameter_change d_model=-1", lambda: F.feed_forward_parameter_change(-1, 8), ValueError,
     r"d_model=-1 must be an int >= 1"),
    ("feed_forward_parameter_change d_ff=0", lambda: F.feed_forward_parameter_change(4, 0), ValueError,
     r"d_ff=0 must be an int >= 1"),
    ("feed_forward_parameter_change bias=1", lambda: F.feed_forward_parameter_change(4, 8, gated_layer_bias=1),
     TypeError, r"gated_layer_bias=1 must be True or False"),
    ("apply_ghost_batchnorm model=3", lambda: F.apply_ghost_batchnorm(3, 2), TypeError, r"model of type int"),
    ("gyro_dropout_masks features=0", lambda: F.gyro_dropout_masks(KEY, 0, 0, 0.5, 4, 2, 2), ValueError,
     r"features=0 must be an int >= 1"),
    ("gyro_dropout_masks step=-1", lambda: F.gyro_dropout_masks(KEY, -1, 4, 0.5, 4, 2, 2), ValueError,
     r"step=-1 must be an int >= 0"),
    ("gyro_dropout_masks period=0", lambda: F.gyro_dropout_masks(KEY, 0, 4, 0.5, 4, 2, 0), ValueError,
     r"period=0 must be an int >= 1"),
    ("scaled_sequence_length batch_size=0", lambda: F.scaled_sequence_length(0, 8, 0.5), ValueError,
     r"batch_size=0 must be an int >= 1"),
    # sequence length warmup
    ("set_batch_sequence_length lengths",
     lambda: F.set_batch_sequence_length((TOKENS, TOKENS[:, :12]), 8, truncate=False),
     ValueError, r"batch item 1 has shape \(4, 12\): truncate=False re-cuts the rows of the tokens 0 \(4, 16\)"),
    ("set_batch_sequence_length rows", lambda: F.set_batch_sequence_length((TOKENS, TOKENS[:3]), 8), ValueError,
     r"batch item 1 has shape \(3, 16\) and batch item 0 \(4, 16\)"),
    ("set_batch_sequence_length truncate=1", lambda: F.set_batch_sequence_length((TOKENS,), 8, truncate=1),
     TypeError, r"truncate=1 must be True or False"),
    ("SeqLengthWarmup preserve_end_of_sequence='yes'", lambda: A.SeqLengthWarmup(preserve_end_of_sequence="yes"),
     TypeError, r"preserve_end_of_sequence='yes' must be True or False"),
    # augmentations
    ("randaugment_params batch_size=2.5", lambda: F.randaugment_params(KEY, 2.5), ValueError,
     r"batch_size=2.5 must be an int >= 1"),
    ("augmix_params batch_size=2.5", lambda: F.augmix_params(KEY, 2.5), ValueError,
     r"batch_size=2.5 must be an int >= 1"),
    ("cutout_params batch_size=2.5", lambda: F.cutout_params(KEY, 2.5, 8, 8), ValueError,
     r"batch_size=2.5 must be an int >= 1"),
    ("CutOut per_sample=1", lambda: A.CutOut(per_sample=1), TypeError, r"per_sample=1 must be True or False"),
    ("standardize_weight 1-D", lambda: F.standardize_weight(torch.ones(4)), ValueError,
     r"weight of shape \(4,\) and dtype torch.float32: expected a floating-point weight \[out, in, ...\]"),
    ("channels_last_tensors keep", lambda: F.channels_last_tensors({"w": torch.ones(2, 2, 3, 3)}, keep=("v",)),
     ValueError, r"keep names \['v'\], which tensors does not hold"),
    ("random_crop_flip_apply padding=-1", lambda: F.random_crop_flip_apply(IMAGES, F.random_crop_flip_params(KEY, 4),
     padding=-1), ValueError, r"padding=-1 must be an int >= 0"),
    ("mixup_apply 0-d", lambda: F.mixup_apply(torch.tensor(1.0), INDICES[:1], 0.2), ValueError,
     r"input of shape \(\): expected a batch"),
    ("apply_factorization model=3", lambda: F.apply_factorization(3), TypeError, r"model of type int"),
    ("apply_gyro_dropout model=3", lambda: F.apply_gyro_dropout(3, 1, 1, key=KEY), TypeError, r"model of type int"),
    ("apply_low_precision_groupnorm model=3", lambda: F.apply_low_precision_groupnorm(3), TypeError,
     r"model of type int"),
    ("apply_weight_standardization module=3", lambda: F.apply_weight_standardization(3), TypeError,
     r"module of type int"),
    ("apply_channels_last model=3", lambda: F.apply_channels_last(3), TypeError, r"model of type int"),
    # optimizers and keyed layers
    ("apply_updates shapes", lambda: optim.apply_updates({"w": torch.ones(2)}, {"w": torch.ones(3)}), ValueError,
     r"updates\['w'\] of shape \(3,\) does not fit params\['w'\] of shape \(2,\)"),
    ("forward_keys step_key=0", lambda: forward_keys(("a",), 0), TypeError, r"step_key=0 must be a key"),
    # keys
    ("R.split n=1.5", lambda: R.split(KEY, 1.5), ValueError, r"n=1.5 must be an int >= 1"),
    ("R.permutation n=1.5", lambda: R.permutation(KEY, 1.5), ValueError, r"n=1.5 must be an int >= 0"),
    ("R.randint low=1.5", lambda: R.randint(KEY, 1.5, 3, 2), ValueError, r"low=1.5 must be an int"),
    ("R.bernoulli p=np.float32(2)", lambda: R.bernoulli(KEY, np.float32(2.0), 3), ValueError,
     r"p=.*2.* must be a probability in \[0, 1\]"),
    ("R.fold_in float data", lambda: R.fold_in(KEY, 1.5), TypeError, r"data=1.5 must be an integer"),
    ("R.fold_in float key", lambda: R.fold_in(torch.zeros(3), 1), TypeError,
     r"key=a tensor of dtype torch.float32 and shape \(3,\) must be a key"),
    ("R.name_to_int 3", lambda: R.name_to_int(3), TypeError, r"name=3 must be a str"),
]


@pytest.mark.parametrize(("build", "error", "message"), [case[1:] for case in BAD_INPUTS],
                         ids=[case[0] for case in BAD_INPUTS])
def test_a_bad_argument_is_refused_naming_it(build: Callable[[], Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build()


def test_recompute_batchnorm_refuses_no_inputs_before_resetting_anything() -> None:
    model = _norm_model()
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    with pytest.raises(ValueError, match=r"inputs=\[\] yields no batch: .* \(nothing was reset\)"):
        F.recompute_batchnorm(model, dict(model.named_parameters()), buffers, [])
    assert all(torch.equal(b, dict(model.named_buffers())[name]) for name, b in buffers.items())


def test_select_using_loss_refuses_non_finite_losses() -> None:
    def nan_loss(outputs: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return torch.full((outputs.shape[0],), _NAN)

    with pytest.raises(ValueError, match=r"gave a non-finite loss \(nan\) for sample 0"):
        F.select_using_loss(IMAGES, LABELS, _LINEAR, nan_loss, key=KEY)


NO_OPS: list[tuple[Callable[[], Any], str]] = [
    (lambda: A.MixUp(alpha=0), r"MixUp\(alpha=0\) changes nothing"),
    (lambda: A.RandAugment(depth=0), r"RandAugment\(depth=0\) changes nothing"),
    (lambda: A.LabelSmoothing(smoothing=0), r"LabelSmoothing\(smoothing=0\) changes nothing"),
    (lambda: A.SelectiveBackprop(keep=1), r"SelectiveBackprop\(keep=1\) changes nothing"),
    (lambda: A.SelectiveBackprop(start=0.5, end=0.5), r"SelectiveBackprop\(start=0.5, end=0.5\) changes nothing"),
    (lambda: A.ProgressiveResizing(initial_scale=1), r"ProgressiveResizing\(initial_scale=1\) changes nothing"),
    (lambda: A.LayerFreezing(freeze_level=0), r"LayerFreezing\(freeze_level=0\) changes nothing"),
    (lambda: A.StochasticDepth("BasicBlock", drop_rate=0), r"StochasticDepth\(drop_rate=0\) changes nothing"),
    (lambda: A.ColOut(p_row=0, p_col=0), r"ColOut\(p_row=0, p_col=0\) changes nothing"),
    (lambda: A.CutOut(num_holes=0), r"CutOut\(num_holes=0\) changes nothing"),
    (lambda: A.CutOut(length=0), r"CutOut\(length=0\) changes nothing"),
    (lambda: A.RandomCropFlip(padding=0, flip_p=0), r"RandomCropFlip\(padding=0, flip_p=0\) changes nothing"),
    (lambda: A.SAM(rho=0), r"SAM\(rho=0\) changes nothing but the cost"),
]


@pytest.mark.parametrize(("build", "message"), NO_OPS, ids=[m.split("\\")[0] + str(i) for i, (_, m) in enumerate(NO_OPS)])
def test_a_setting_that_changes_nothing_warns_once_at_construction(build: Callable[[], Any], message: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    assert len(caught) == 1 and caught[0].category is UserWarning
    assert re.match(message, str(caught[0].message))
    # The warning points at the line that built the record, not into the library.
    assert caught[0].filename == __file__


@pytest.mark.parametrize(("build", "message"), NO_OPS, ids=[m.split("\\")[0] + str(i) for i, (_, m) in enumerate(NO_OPS)])
def test_a_setting_that_changes_nothing_is_declared_by_the_record_in_the_words_it_warns(
    build: Callable[[], Any], message: str
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = build()
    assert record.changes_nothing() == str(caught[0].message)
    assert re.match(message, record.changes_nothing() or "")


@dataclasses.dataclass(frozen=True)
class _TaggedMixUp(A.MixUp):
    tag: str = "mine"


@pytest.mark.parametrize(
    "build",
    [
        lambda: dataclasses.replace(A.MixUp(), alpha=0),
        lambda: _TaggedMixUp(alpha=0),
        lambda: A.MixUp(alpha=np.float32(0)),
    ],
    ids=["replace", "subclass", "numpy"],
)
def test_a_record_built_any_way_warns_once_when_its_settings_change_nothing(build: Callable[[], Any]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = build()
    assert [str(w.message) for w in caught] == [record.changes_nothing()]
    assert re.match(r"MixUp\(alpha=0\) changes nothing", str(caught[0].message))


def test_default_settings_warn_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for record in (A.MixUp(), A.RandAugment(), A.LabelSmoothing(), A.SelectiveBackprop(), A.ColOut(),
                       A.CutOut(), A.RandomCropFlip(), A.SAM(), A.LayerFreezing(), A.ProgressiveResizing()):
            assert record.to_config()
            assert record.changes_nothing() is None


def _fit(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor], batch_size: int, algorithm: Any,
         **kwargs: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(model, TensorLoader(data, batch_size=batch_size, seed=0), max_duration="2ba",
                optimizer=optim.sgd(0.01), algorithms=[algorithm], progress_bar=False, **kwargs).fit()
    return [str(w.message) for w in caught if "changes nothing" in str(w.message) or "never reaches" in str(w.message)]


def test_ghost_batchnorm_larger_than_the_batch_warns_once_at_the_first_batch() -> None:
    data = (torch.randn(8, 2), torch.arange(8) % 2)
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    messages = _fit(model, data, 4, A.GhostBatchNorm(ghost_batch_size=4))
    assert messages == [
        "GhostBatchNorm(ghost_batch_size=4) changes nothing on batches of 4 samples: a batch of at most "
        "ghost_batch_size samples is normalized as one chunk, which is plain BatchNorm; use ghost_batch_size < 4"
    ]
    assert _fit(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), data, 4, A.GhostBatchNorm(ghost_batch_size=2)) == []


def _token_rows(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = R.randint(R.key(1), 0, 16, (8, length + 1))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


@pytest.mark.parametrize(
    ("warmup", "message"),
    [
        (A.SeqLengthWarmup(duration="1ba", min_seq_length=4, max_seq_length=8, step_size=4),
         r"SeqLengthWarmup\(max_seq_length=8\) never reaches the data's sequence length of 16 tokens: every batch"),
        (A.SeqLengthWarmup(duration="1ba", min_seq_length=16, max_seq_length=32, step_size=8),
         r"SeqLengthWarmup\(min_seq_length=16\) changes nothing: the data's sequences hold 16 tokens"),
    ],
    ids=["never reaches", "never shortens"],
)
def test_a_sequence_warmup_that_misses_the_datas_length_warns_once_at_the_first_batch(warmup: Any, message: str) -> None:
    model = CausalLM(16, d_model=8, n_heads=2, n_layers=1, max_seq_len=32)
    messages = _fit(model, _token_rows(16), 4, warmup, loss_fn=causal_lm_loss())
    assert len(messages) == 1 and re.match(message, messages[0])


GOOD_NUMPY_INPUTS: list[tuple[str, Callable[[], Any]]] = [
    ("R.key(np.int64)", lambda: R.key(np.int64(3))),
    ("R.key(np.uint64)", lambda: R.key(np.uint64(3))),
    ("R.fold_in np.int64", lambda: R.fold_in(KEY, np.int64(3))),
    ("R.split np.int64", lambda: R.split(KEY, np.int64(3))),
    ("R.bits np shape", lambda: R.bits(KEY, (np.int64(3),))),
    ("R.uniform np shape", lambda: R.uniform(KEY, np.int64(3))),
    ("R.permutation np.int64", lambda: R.permutation(KEY, np.int64(3))),
    ("R.randint np.int64", lambda: R.randint(KEY, np.int64(0), np.int64(4), 3)),
    ("R.bernoulli np.float32", lambda: R.bernoulli(KEY, np.float32(0.5), 3)),
    ("mixup_params", lambda: F.mixup_params(KEY, np.int64(4), alpha=np.float32(0.2))),
    ("mixup_batch", lambda: F.mixup_batch(IMAGES, LABELS, key=KEY, num_classes=np.int64(3))),
    ("cutmix_params", lambda: F.cutmix_params(KEY, np.int64(4), np.int64(8), np.int64(8), length=np.float32(0.5))),
    ("colout_params", lambda: F.colout_params(KEY, np.int64(8), np.int64(8), p_row=np.float32(0.2))),
    ("pinned_size", lambda: F.pinned_size(np.int64(8), np.int64(8), np.float32(0.5), np.int64(4))),
    ("blur_2d stride", lambda: F.blur_2d(IMAGES, stride=np.int64(2))),
    ("blurmax_pool2d", lambda: F.blurmax_pool2d(IMAGES, np.int64(2), stride=np.int64(2))),
    ("factorize_matrix rank", lambda: F.factorize_matrix(torch.rand(8, 4), torch.rand(8, 4), torch.rand(4, 4),
                                                          rank=np.float32(0.5))),
    ("factorize_conv2d padding", lambda: F.factorize_conv2d(torch.rand(2, 4, 5, 5), torch.rand(4, 4, 3, 3),
                                                             rank=np.int64(1), padding=np.int64(1))),
    ("apply_factorization latent", lambda: F.apply_factorization(nn.Sequential(nn.Linear(16, 16)), min_features=4,
                                                                 latent_features=np.float32(0.25))),
    ("drop_rates", lambda: F.drop_rates(np.float32(0.2), np.int64(3))),
    ("gyro_dropout_masks", lambda: F.gyro_dropout_masks(KEY, np.int64(0), np.int64(4), np.float32(0.5),
                                                        np.int64(4), np.int64(2), np.int64(2))),
    ("randaugment_params", lambda: F.randaugment_params(KEY, np.int64(4), depth=np.int64(2))),
    ("augmix_params", lambda: F.augmix_params(KEY, np.int64(4), width=np.int64(2))),
    ("cutout_params", lambda: F.cutout_params(KEY, np.int64(4), 8, 8, num_holes=np.int64(2))),
    ("random_crop_flip_params", lambda: F.random_crop_flip_params(KEY, np.int64(4), padding=np.int64(2))),
    ("set_batch_sequence_length", lambda: F.set_batch_sequence_length((TOKENS,), np.int64(8))),
]


@pytest.mark.parametrize("build", [case[1] for case in GOOD_NUMPY_INPUTS], ids=[case[0] for case in GOOD_NUMPY_INPUTS])
def test_numpy_numbers_are_accepted_by_the_functional_api(build: Callable[[], Any]) -> None:
    build()


def test_a_numpy_seed_gives_the_key_of_the_python_seed() -> None:
    for seed in (3, 2**40 + 7, 2**64 - 1):
        assert torch.equal(R.key(np.uint64(seed)), R.key(seed))
    assert torch.equal(R.key(np.int64(3)), R.key(3))
    assert torch.equal(R.fold_in(KEY, np.int64(5)), R.fold_in(KEY, 5))


RECORDS_WITH_NUMPY_NUMBERS: list[Callable[[], Any]] = [
    lambda: A.MixUp(alpha=np.float32(0.2)),
    lambda: A.CutMix(alpha=np.float32(0.5)),
    lambda: A.Factorize(latent_channels=np.float32(0.25), latent_features=np.int64(64), min_channels=np.int64(8)),
    lambda: A.StochasticDepth(drop_rate=np.float32(0.2), drop_warmup=np.float32(0.1)),
    lambda: A.SeqLengthWarmup(duration=np.float32(0.3), max_seq_length=np.int64(64)),
    lambda: A.SelectiveBackprop(start=np.float32(0.5), keep=np.float32(0.5), interrupt=np.int64(2)),
    lambda: A.GhostBatchNorm(ghost_batch_size=np.int64(2)),
]


@pytest.mark.parametrize("build", RECORDS_WITH_NUMPY_NUMBERS)
def test_numpy_numbers_are_accepted_by_the_algorithm_records(build: Callable[[], Any]) -> None:
    json.dumps(build().to_config())
