"""AugMix: keyed chains and Dirichlet/Beta weights, mixed per image exactly as Composer's formula says."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from composer_fn.algorithms import _augment as ops
from composer_fn.algorithms.augmix import (
    AugmentAndMixTransform,
    AugMix,
    AugMixParams,
    _log_gamma_variates,
    augmix_apply,
    augmix_batch,
    augmix_image,
    augmix_params,
)
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.event import Event
from composer_fn.core.state import StepCtx

seeds = st.integers(0, 2**32 - 1)
batches = st.integers(1, 5)
sides = st.integers(1, 6)
depths = st.integers(-1, 3)
widths = st.integers(1, 4)
alphas = st.floats(0.05, 5.0)
severities = st.floats(0.0, 10.0)
DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32)


def _images(seed: int, shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    values = R.randint(R.fold_in(R.key(seed), 0), 0, 256, shape)
    return values.to(torch.uint8) if dtype == torch.uint8 else (values.float() / 255).to(dtype)


def _reference(images: torch.Tensor, params: AugMixParams) -> torch.Tensor:
    """Composer's formula image by image in float64: (1 - m) * image + m * sum_k w_k * chain_k."""
    outs = []
    for i in range(images.shape[0]):
        image = images[i : i + 1]
        combination = torch.zeros(image.shape, dtype=torch.float64)
        for chain in range(params.op.shape[1]):
            augmented = image
            op = params.op[i : i + 1, chain]
            value = ops.op_arguments(
                op, params.magnitude[i : i + 1, chain], params.sign[i : i + 1, chain], image
            )
            for step in range(op.shape[1]):
                augmented = ops.apply_op(augmented, op[:, step], value[:, step])
            combination += float(params.chain_weights[i, chain]) * augmented.double()
        mixing = float(params.mixing[i])
        outs.append((1 - mixing) * image.double() + mixing * combination)
    return torch.cat(outs)


@given(seeds, batches, depths, widths, alphas, severities)
def test_draws_have_the_right_shapes_and_weights_are_distributions(
    seed, batch, depth, width, alpha, severity
) -> None:
    params = augmix_params(R.key(seed), batch, severity=severity, depth=depth, width=width, alpha=alpha)
    steps = depth if depth > 0 else 3
    assert params.op.shape == params.magnitude.shape == params.sign.shape == (batch, width, steps)
    assert params.chain_weights.shape == (batch, width) and params.mixing.shape == (batch,)
    assert bool((params.chain_weights >= 0).all()) and bool(
        (params.mixing >= 0).all() & (params.mixing <= 1).all()
    )
    torch.testing.assert_close(params.chain_weights.sum(dim=1), torch.ones(batch), rtol=0, atol=1e-6)
    active = params.op != ops.IDENTITY
    if depth > 0:
        assert bool(active.all())
    else:
        # 1 to 3 ops per chain, the identity only after the chain's last op.
        chain_depth = active.sum(dim=2)
        assert bool(((chain_depth >= 1) & (chain_depth <= 3)).all())
        assert torch.equal(active, torch.arange(3) < chain_depth.unsqueeze(-1))


def test_random_chain_depths_are_uniform_over_one_to_three() -> None:
    params = augmix_params(R.key(0), 3000, depth=-1)
    counts = torch.bincount((params.op != ops.IDENTITY).sum(dim=2).flatten(), minlength=4)[1:]
    assert bool(((counts - 3000).abs() < 200).all())


@pytest.mark.parametrize("alpha", [0.1, 0.5, 1.0, 4.0])
def test_gamma_variates_have_the_gamma_mean_and_variance(alpha: float) -> None:
    samples = _log_gamma_variates(R.key(3), alpha, (50_000,)).exp()
    assert abs(samples.mean().item() - alpha) < 0.02 * max(alpha, 1.0)
    assert abs(samples.var().item() - alpha) < 0.05 * max(alpha, 1.0)


@pytest.mark.parametrize("alpha", [0.2, 1.0, 3.0])
def test_mixing_weights_follow_beta_and_chain_weights_follow_dirichlet(alpha: float) -> None:
    params = augmix_params(R.key(1), 20_000, width=3, alpha=alpha)
    beta_variance = 1.0 / (4.0 * (2.0 * alpha + 1.0))
    assert abs(params.mixing.mean().item() - 0.5) < 0.01
    assert abs(params.mixing.var().item() - beta_variance) < 0.05 * beta_variance
    weights = params.chain_weights
    dirichlet_variance = (1.0 / 3.0) * (2.0 / 3.0) / (3.0 * alpha + 1.0)
    assert bool(((weights.mean(dim=0) - 1.0 / 3.0).abs() < 0.01).all())
    assert bool(((weights.var(dim=0) - dirichlet_variance).abs() < 0.05 * dirichlet_variance).all())


@given(seeds, batches, sides, sides, depths, widths, st.sampled_from([torch.uint8, torch.float32]))
def test_the_batch_follows_composers_mixing_formula_image_by_image(
    seed, batch, h, w, depth, width, dtype
) -> None:
    x = _images(seed, (batch, 3, h, w), dtype)
    params = augmix_params(R.key(seed), batch, severity=5, depth=depth, width=width)
    out = augmix_apply(x, params)
    expected = _reference(x, params)
    if dtype == torch.uint8:
        # Rounded back to uint8; float32 against float64 arithmetic may round a half the other way.
        assert bool(((out.double() - expected.round().clamp(0, 255)).abs() <= 1).all())
    else:
        torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)


@given(seeds, batches, sides, sides, st.sampled_from(DTYPES))
def test_zero_mixing_gives_the_images_back(seed, batch, h, w, dtype) -> None:
    x = _images(seed, (batch, 3, h, w), dtype)
    params = augmix_params(R.key(seed), batch)._replace(mixing=torch.zeros(batch))
    assert torch.equal(augmix_apply(x, params), x)


@given(seeds, batches, sides, sides)
def test_full_mixing_of_one_chain_of_one_op_is_that_op(seed, batch, h, w) -> None:
    x = _images(seed, (batch, 3, h, w))
    params = augmix_params(R.key(seed), batch, depth=1, width=1)._replace(mixing=torch.ones(batch))
    value = ops.op_arguments(params.op[:, 0, 0], params.magnitude[:, 0, 0], params.sign[:, 0, 0], x)
    assert torch.equal(augmix_apply(x, params), ops.apply_op(x, params.op[:, 0, 0], value))


@given(seeds, batches, sides, sides, st.sampled_from(DTYPES))
def test_augmix_keeps_shape_and_dtype_and_leaves_its_input_unchanged(seed, batch, h, w, dtype) -> None:
    x = _images(seed, (batch, 3, h, w), dtype)
    copy, version = x.clone(), x._version
    out = augmix_batch(x, severity=10, key=R.key(seed))
    assert out.shape == x.shape and out.dtype == dtype
    assert torch.equal(x, copy) and x._version == version


@given(seeds, batches, sides, sides)
def test_the_same_key_gives_the_same_images_and_other_keys_other_draws(seed, batch, h, w) -> None:
    x = _images(seed, (batch, 3, h, w))
    assert torch.equal(augmix_batch(x, key=R.key(seed)), augmix_batch(x, key=R.key(seed)))
    first, other = augmix_params(R.key(seed), 16), augmix_params(R.key(seed ^ 1), 16)
    assert not torch.equal(first.mixing, other.mixing)
    assert not torch.equal(first.op, other.op)


@given(seeds, sides, sides)
def test_one_image_is_mixed_like_a_batch_of_one(seed, h, w) -> None:
    x = _images(seed, (1, 1, h, w))
    assert torch.equal(augmix_image(x[0], key=R.key(seed)), augmix_batch(x, key=R.key(seed))[0])


def test_the_transform_is_keyed_by_index_or_key_and_takes_pil_images() -> None:
    image = _images(1, (1, 3, 8, 8))[0]
    transform = AugmentAndMixTransform(seed=2)
    assert torch.equal(transform(image, 5), augmix_image(image, key=R.fold_in(R.fold_in(R.key(2), 0), 5)))
    assert torch.equal(transform(image, key=R.key(9)), augmix_image(image, key=R.key(9)))
    first, second = transform(image), transform(image)
    replay = AugmentAndMixTransform(seed=2)
    assert torch.equal(first, replay(image)) and torch.equal(second, replay(image))
    out = transform(Image.fromarray(image.permute(1, 2, 0).numpy()), 5)
    assert torch.equal(torch.from_numpy(np.array(out)).permute(2, 0, 1), transform(image, 5))


def test_the_algorithm_mixes_with_what_augmix_params_draws_from_the_step_key() -> None:
    algorithm = AugMix(severity=4, depth=2, width=2, alpha=0.5, augmentation_set="safe")
    images = _images(3, (8, 3, 8, 8), torch.float32)
    plan = make_plan([algorithm])
    step_key = R.fold_in(R.key(6), 2)
    ctx = StepCtx(batch=(images, torch.zeros(8)), key=step_key, loss_fn=lambda o, b: o.sum())
    _, ctx = plan.hooks[Event.AFTER_DATALOADER][0](None, ctx)
    expected = augmix_params(
        R.fold_in(step_key, R.name_to_int("augmix")),
        8,
        severity=4,
        depth=2,
        width=2,
        alpha=0.5,
        augmentation_set="safe",
    )
    assert torch.equal(ctx.batch[0], augmix_apply(images, expected))



@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32], ids=str)
def test_compiled_augmix_equals_eager_bitwise(fresh_compiler, dtype) -> None:
    x = _images(2, (6, 3, 9, 7), dtype)

    def augment(key: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
        return augmix_apply(input, augmix_params(key, 6, severity=3, depth=-1, width=3, alpha=1.0))

    compiled = torch.compile(augment, backend="aot_eager", fullgraph=True, dynamic=False)
    for seed in (0, 1):
        assert torch.equal(augment(R.key(seed), x), compiled(R.key(seed), x))



def test_bad_arguments_name_the_argument_and_value() -> None:
    with pytest.raises(ValueError, match="severity=-1"):
        AugMix(severity=-1)
    with pytest.raises(ValueError, match="width=0"):
        AugMix(width=0)
    with pytest.raises(ValueError, match="alpha=0"):
        AugMix(alpha=0)
    with pytest.raises(ValueError, match="augmentation_set='most'"):
        AugmentAndMixTransform(augmentation_set="most")
    params = augmix_params(R.key(0), 3)
    with pytest.raises(ValueError, match=r"params.op of shape \(3, 3, 3\)"):
        augmix_apply(torch.zeros(2, 3, 4, 4), params)
    with pytest.raises(TypeError, match="int64"):
        augmix_batch(torch.zeros(2, 3, 4, 4, dtype=torch.int64), key=R.key(0))
