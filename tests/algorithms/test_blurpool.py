"""BlurPool: the blur is a normalised low-pass filter, blurred layers keep the replaced layers' shapes and equal
blur-then-conv (or conv-then-blur), and the surgery is pure, idempotent and selective."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from composer_fn.algorithms.blurpool import (
    BlurConv2d,
    BlurMaxPool2d,
    BlurPool,
    apply_blurpool,
    blur_2d,
    blurmax_pool2d,
    default_blur_filter,
)
from composer_fn.core import random as R
from composer_fn.models.resnet import CIFARResNet
from composer_fn.nn import init_parameters
from composer_fn.testing import check_compiled_matches_eager, make_setup


def _reference_blur(images: Tensor, stride: int) -> Tensor:
    """The 3x3 binomial blur written as a weighted sum of shifted copies of the zero-padded images."""
    weights = [[1, 2, 1], [2, 4, 2], [1, 2, 1]]
    padded = F.pad(images, (1, 1, 1, 1))
    height, width = images.shape[-2:]
    total = sum(
        weights[a][b] * padded[..., a : a + height, b : b + width] for a in range(3) for b in range(3)
    )
    return (total / 16)[..., ::stride, ::stride]


def _conv(
    in_channels: int, out_channels: int, kernel: int, stride: int, padding: int, seed: int
) -> nn.Conv2d:
    with torch.device("meta"):
        conv = nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=padding, bias=True)
    conv.to_empty(device="cpu")
    conv.load_state_dict(init_parameters(conv, R.key(seed)))
    return conv


def test_the_default_filter_sums_to_one_so_a_constant_image_stays_constant_inside_the_border() -> None:
    assert default_blur_filter().sum().item() == 1.0
    for value in (-2.5, 0.0, 3.0):
        blurred = blur_2d(torch.full((2, 3, 7, 9), value))
        assert blurred.shape == (2, 3, 7, 9)
        assert torch.equal(blurred[..., 1:-1, 1:-1], torch.full((2, 3, 5, 7), value))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), stride=st.integers(1, 3), side=st.integers(1, 9))
def test_blur_2d_equals_the_weighted_sum_of_shifted_images(seed: int, stride: int, side: int) -> None:
    images = R.normal(R.key(seed), (2, 3, side, side + 1))
    torch.testing.assert_close(blur_2d(images, stride=stride), _reference_blur(images, stride))


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    stride=st.integers(2, 3),
    side=st.integers(1, 9),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    autocast=st.booleans(),
)
def test_a_strided_16_bit_blur_is_the_exact_blur_rounded_once_with_the_dtype_torch_gives(
    seed: int, stride: int, side: int, dtype: torch.dtype, autocast: bool
) -> None:
    # 16-bit images, or fp32 images under autocast: the strided blur and its input gradient are the fp64 ones of
    # the same 16-bit values to within one rounding, in the dtype F.conv2d returns there. (Torch's 16-bit CPU
    # kernels, which a blur at stride 1 keeps, round their sums more than once on some CPUs.)
    images = R.normal(R.key(seed), (2, 3, side, side + 1))
    given_images = (images if autocast else images.to(dtype)).requires_grad_()
    with torch.autocast("cpu", dtype=dtype, enabled=autocast):
        blurred = blur_2d(given_images, stride=stride)
        filter = default_blur_filter().to(given_images.dtype).expand(3, 1, 3, 3)
        torch_dtype = F.conv2d(given_images, filter, padding=1, groups=3).dtype
    assert blurred.dtype == torch_dtype == dtype
    upstream = R.normal(R.key(seed + 1), blurred.shape).to(dtype)
    (gradient,) = torch.autograd.grad(blurred, given_images, upstream)
    exact_images = images.to(dtype).double().requires_grad_()
    exact = _reference_blur(exact_images, stride)
    (exact_gradient,) = torch.autograd.grad(exact, exact_images, upstream.double())
    one_rounding = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    torch.testing.assert_close(blurred.double(), exact, rtol=one_rounding, atol=1e-6)
    torch.testing.assert_close(gradient.double(), exact_gradient.to(dtype).double(), rtol=one_rounding, atol=1e-6)


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    kernel=st.sampled_from([1, 3, 5]),
    stride=st.integers(2, 3),
    padding=st.integers(0, 2),
    side=st.integers(5, 11),
    blur_first=st.booleans(),
)
def test_a_blurred_convolution_keeps_the_shape_and_equals_blur_then_conv_or_conv_then_blur(
    seed: int, kernel: int, stride: int, padding: int, side: int, blur_first: bool
) -> None:
    conv = _conv(4, 6, kernel, stride, padding, seed)
    images = R.normal(R.fold_in(R.key(seed), 1), (2, 4, side, side))
    blurred = BlurConv2d(conv, blur_first=blur_first)
    output = blurred(images)
    assert output.shape == conv(images).shape
    if blur_first:
        expected = conv(_reference_blur(images, 1))
    else:
        expected = _reference_blur(
            F.conv2d(images, conv.weight, conv.bias, stride=1, padding=padding), stride
        )
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    assert blurred.blur_filter.shape == (4 if blur_first else 6, 1, 3, 3)
    assert blurred.conv.stride == ((stride, stride) if blur_first else (1, 1))


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    kernel=st.integers(2, 3),
    stride=st.integers(1, 3),
    side=st.integers(4, 10),
    padded=st.booleans(),
)
def test_a_blurred_max_pool_keeps_the_shape_and_blurs_the_stride_one_maxima(
    seed: int, kernel: int, stride: int, side: int, padded: bool
) -> None:
    padding = kernel // 2 if padded else 0
    images = R.normal(R.key(seed), (2, 3, side, side))
    pool = nn.MaxPool2d(kernel, stride, padding)
    output = BlurMaxPool2d(kernel, stride, padding)(images)
    assert output.shape == pool(images).shape
    maxima = F.max_pool2d(images, kernel, stride=1, padding=padding)
    torch.testing.assert_close(output, _reference_blur(maxima, stride))
    torch.testing.assert_close(blurmax_pool2d(images, kernel, stride, padding), output, rtol=0, atol=0)


def _model(seed: int = 0) -> nn.Module:
    # Convolutions with 4 input channels (stem), 8 (layer2.0) and 16 (layer3.0), a max pool after the stem.
    net = CIFARResNet(8, width=8, in_channels=4, num_classes=3, key=R.key(seed))
    return nn.Sequential(net.conv1, nn.MaxPool2d(2, 1), net.layer1, net.layer2, net.layer3)


def _structure(model: nn.Module) -> list[tuple[str, str]]:
    return [(name, type(m).__name__) for name, m in model.named_modules()]


def test_only_strided_convolutions_with_enough_input_channels_and_max_pools_are_replaced() -> None:
    model = _model()
    strided = {"3.0.conv1": 8, "3.0.shortcut.0": 8, "4.0.conv1": 16, "4.0.shortcut.0": 16}
    for min_channels in (0, 8, 9, 16, 17):
        chosen = {name for name, channels in strided.items() if channels >= min_channels}
        assert BlurPool(min_channels=min_channels).targets(model) == frozenset(chosen | {"1"})
        blurred = apply_blurpool(model, min_channels=min_channels, replace_maxpools=False)
        replaced = {n for n, m in blurred.named_modules() if isinstance(m, BlurConv2d)}
        assert replaced == chosen
    assert BlurPool(replace_convs=False).targets(model) == frozenset({"1"})
    assert BlurPool(replace_maxpools=False, replace_convs=False).targets(model) == frozenset()


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), blur_first=st.booleans())
def test_apply_blurpool_is_pure_and_idempotent(seed: int, blur_first: bool) -> None:
    model = _model(seed % 7).eval()
    before = {n: t.clone() for n, t in model.state_dict().items()}
    structure = _structure(model)
    images = R.normal(R.key(seed), (2, 4, 8, 8))
    original = model(images)
    once = apply_blurpool(model, blur_first=blur_first, min_channels=8)
    twice = apply_blurpool(once, blur_first=blur_first, min_channels=8)
    assert _structure(model) == structure
    assert all(torch.equal(t, before[n]) for n, t in model.state_dict().items())
    torch.testing.assert_close(model(images), original, rtol=0, atol=0)
    assert BlurPool(blur_first=blur_first, min_channels=8).targets(once) == frozenset()
    assert _structure(twice) == _structure(once) != structure
    torch.testing.assert_close(twice(images), once(images), rtol=0, atol=0)
    own = {t.data_ptr() for t in model.state_dict().values()}
    assert not own & {t.data_ptr() for t in once.state_dict().values()}
    assert not once.training


def test_the_algorithm_rewrites_the_model_at_init_like_the_function() -> None:
    algorithm = BlurPool(min_channels=8)
    setup = make_setup([algorithm])
    plain = make_setup([])
    expected = apply_blurpool(plain.static.module, min_channels=8)
    assert _structure(setup.static.module) == _structure(expected)
    assert "features.1.0.conv.weight" in setup.state.params
    assert torch.equal(
        setup.state.params["features.1.0.conv.weight"], plain.state.params["features.1.0.weight"]
    )
    assert algorithm.targets(setup.static.module) == frozenset()


@pytest.mark.slow
def test_blurred_training_steps_compile_to_the_eager_result(fresh_compiler: None) -> None:
    check_compiled_matches_eager(BlurPool(min_channels=8, blur_first=False))


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: BlurPool(min_channels=-1), ValueError, "min_channels=-1"),
        (lambda: BlurPool(blur_first=1), TypeError, "blur_first=1"),
        (lambda: apply_blurpool(nn.Conv2d(1, 1, 1), replace_convs="yes"), TypeError, "replace_convs='yes'"),
        (lambda: apply_blurpool("model"), TypeError, "model of type str"),
        (lambda: blur_2d(torch.zeros(3, 4, 4)), ValueError, r"input \(3, 4, 4\)"),
        (lambda: blur_2d(torch.zeros(1, 2, 4, 4), filter=torch.ones(2, 2)), ValueError, "must be odd"),
        (
            lambda: blur_2d(torch.zeros(1, 2, 4, 4), filter=torch.ones(3, 1, 3, 3)),
            ValueError,
            r"\[2, 1, kh, kw\]",
        ),
        (lambda: BlurConv2d(nn.Linear(2, 2)), TypeError, "conv of type Linear"),
    ],
)
def test_bad_arguments_are_refused_by_name(build, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build()
