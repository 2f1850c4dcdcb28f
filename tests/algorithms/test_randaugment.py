"""RandAugment: each image gets its own keyed chain of ops, applied exactly as the primitives one by one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from composer_fn.algorithms import _augment as ops
from composer_fn.algorithms.randaugment import (
    RandAugment,
    RandAugmentParams,
    RandAugmentTransform,
    randaugment_apply,
    randaugment_batch,
    randaugment_image,
    randaugment_params,
)
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.event import Event
from composer_fn.core.state import StepCtx

seeds = st.integers(0, 2**32 - 1)
batches = st.integers(1, 6)
sides = st.integers(1, 7)
depths = st.integers(0, 3)
severities = st.floats(0.0, 10.0)
sets = st.sampled_from(sorted(ops.augmentation_sets))
DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32)


def _images(seed: int, shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    values = R.randint(R.fold_in(R.key(seed), 0), 0, 256, shape)
    return values.to(torch.uint8) if dtype == torch.uint8 else (values.float() / 255).to(dtype)


def _one_by_one(images: torch.Tensor, params: RandAugmentParams) -> torch.Tensor:
    """Applies each image's ops in order, one image and one op at a time, through the public primitives."""
    height, width = images.shape[-2:]
    scale = 1.0 if images.dtype == torch.uint8 else 1.0 / 255.0
    outs = []
    for i in range(images.shape[0]):
        image = images[i : i + 1]
        for step in range(params.op.shape[1]):
            op_id, sign = int(params.op[i, step]), params.sign[i, step : step + 1]
            magnitude = params.magnitude[i, step : step + 1]
            name = ops.PRIMITIVES[op_id]
            if name in ("autocontrast", "equalize"):
                image = getattr(ops, name)(image)
            elif name.startswith("translate"):
                side = width if name == "translate_x" else height
                image = getattr(ops, name)(image, torch.floor(magnitude * side) * sign)
            elif name == "solarize":
                image = ops.solarize(image, magnitude * scale)
            else:
                image = getattr(ops, name)(image, magnitude * sign)
        outs.append(image)
    return torch.cat(outs)


@given(seeds, batches, depths, severities, sets)
def test_draws_have_the_right_shapes_and_stay_in_the_set(seed, batch, depth, severity, set_name) -> None:
    params = randaugment_params(R.key(seed), batch, depth=depth, severity=severity, augmentation_set=set_name)
    for value in params:
        assert value.shape == (batch, depth)
    names = {name.removesuffix("_original") for name in ops.augmentation_sets[set_name]}
    assert {ops.PRIMITIVES[int(i)] for i in params.op.flatten()} <= names
    assert bool(((params.sign == 1) | (params.sign == -1)).all())
    assert bool((params.magnitude >= 0).all())


def test_ops_are_drawn_uniformly_from_the_set() -> None:
    params = randaugment_params(R.key(0), 4096, depth=2, augmentation_set="safe")
    counts = torch.bincount(params.op.flatten(), minlength=13)
    assert counts[9:].sum() == 0
    expected = params.op.numel() / 9
    assert bool(((counts[:9] - expected).abs() < 5 * expected**0.5).all())
    flipped = params.sign[(params.op == ops.ROTATE)] < 0
    assert abs(flipped.float().mean().item() - 0.5) < 0.05


@given(seeds, batches, sides, sides, depths, severities, sets, st.sampled_from([torch.uint8, torch.float32]))
def test_the_batch_equals_the_primitives_applied_one_image_and_op_at_a_time(
    seed, batch, h, w, depth, severity, set_name, dtype
) -> None:
    x = _images(seed, (batch, 3, h, w), dtype)
    params = randaugment_params(R.key(seed), batch, depth=depth, severity=severity, augmentation_set=set_name)
    assert torch.equal(randaugment_apply(x, params), _one_by_one(x, params))


@given(seeds, batches, sides, sides)
def test_the_same_key_gives_the_same_images_and_other_keys_other_images(seed, batch, h, w) -> None:
    x = _images(seed, (batch, 3, h, w))
    first = randaugment_batch(x, key=R.key(seed))
    assert torch.equal(first, randaugment_batch(x, key=R.key(seed)))
    params = randaugment_params(R.key(seed), 64)
    other = randaugment_params(R.key(seed ^ 1), 64)
    assert not torch.equal(params.op, other.op)


@given(seeds, batches, sides, sides, st.sampled_from(DTYPES))
def test_randaugment_keeps_shape_and_dtype_and_leaves_its_input_unchanged(seed, batch, h, w, dtype) -> None:
    x = _images(seed, (batch, 3, h, w), dtype)
    copy, version = x.clone(), x._version
    out = randaugment_batch(x, severity=10, depth=3, key=R.key(seed))
    assert out.shape == x.shape and out.dtype == dtype
    assert torch.equal(x, copy) and x._version == version


@given(seeds, batches)
def test_depth_zero_returns_a_copy_of_the_images(seed, batch) -> None:
    x = _images(seed, (batch, 1, 4, 4))
    out = randaugment_batch(x, depth=0, key=R.key(seed))
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()


@given(seeds, sides, sides)
def test_one_image_is_augmented_like_a_batch_of_one(seed, h, w) -> None:
    x = _images(seed, (1, 3, h, w))
    assert torch.equal(randaugment_image(x[0], key=R.key(seed)), randaugment_batch(x, key=R.key(seed))[0])


def test_the_transform_is_keyed_by_index_or_key_and_counts_its_calls() -> None:
    image = _images(1, (1, 3, 8, 8))[0]
    transform = RandAugmentTransform(severity=9, depth=2, seed=7)
    by_index = transform(image, 3)
    assert torch.equal(by_index, RandAugmentTransform(seed=7)(image, 3))
    assert torch.equal(by_index, randaugment_image(image, key=R.fold_in(R.fold_in(R.key(7), 0), 3)))
    assert torch.equal(transform(image, key=R.key(5)), randaugment_image(image, key=R.key(5)))
    counted = [transform(image) for _ in range(4)]
    replay = RandAugmentTransform(seed=7)
    assert all(torch.equal(a, replay(image)) for a in counted)
    assert not all(torch.equal(counted[0], c) for c in counted[1:])


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_the_transform_takes_and_returns_pil_images(mode: str) -> None:
    image = _images(2, (1, 3 if mode == "RGB" else 1, 9, 7))[0]
    array = image.permute(1, 2, 0).numpy() if mode == "RGB" else image[0].numpy()
    out = RandAugmentTransform(seed=1)(Image.fromarray(array), 0)
    assert isinstance(out, Image.Image) and out.mode == mode and out.size == (7, 9)
    expected = RandAugmentTransform(seed=1)(image, 0)
    got = torch.from_numpy(np.array(out))
    assert torch.equal(got.permute(2, 0, 1) if mode == "RGB" else got.unsqueeze(0), expected)


def test_the_algorithm_augments_with_what_randaugment_params_draws_from_the_step_key() -> None:
    algorithm = RandAugment(severity=7, depth=3, augmentation_set="original")
    images = _images(3, (8, 3, 8, 8))
    plan = make_plan([algorithm])
    step_key = R.fold_in(R.key(4), 0)
    ctx = StepCtx(batch=(images, torch.zeros(8)), key=step_key, loss_fn=lambda o, b: o.sum())
    _, ctx = plan.hooks[Event.AFTER_DATALOADER][0](None, ctx)
    expected = randaugment_params(
        R.fold_in(step_key, R.name_to_int("randaugment")), 8, depth=3, severity=7, augmentation_set="original"
    )
    assert torch.equal(ctx.batch[0], randaugment_apply(images, expected))



@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32], ids=str)
def test_compiled_randaugment_equals_eager_bitwise(fresh_compiler, dtype) -> None:
    x = _images(2, (16, 3, 9, 7), dtype)

    def augment(key: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
        return randaugment_apply(input, randaugment_params(key, 16, depth=2, severity=9))

    compiled = torch.compile(augment, backend="aot_eager", fullgraph=True, dynamic=False)
    for seed in (0, 1):
        assert torch.equal(augment(R.key(seed), x), compiled(R.key(seed), x))



def test_bad_arguments_name_the_argument_and_value() -> None:
    with pytest.raises(ValueError, match="severity=11"):
        RandAugment(severity=11)
    with pytest.raises(ValueError, match="depth=-1"):
        RandAugment(depth=-1)
    with pytest.raises(ValueError, match="augmentation_set='most'"):
        RandAugmentTransform(augmentation_set="most")
    with pytest.raises(ValueError, match="batch_size=0"):
        randaugment_params(R.key(0), 0)
    with pytest.raises(TypeError, match="int64"):
        randaugment_batch(torch.zeros(2, 3, 4, 4, dtype=torch.int64), key=R.key(0))
    params = randaugment_params(R.key(0), 3)
    with pytest.raises(ValueError, match=r"params.op of shape \(3, 2\)"):
        randaugment_apply(torch.zeros(2, 3, 4, 4), params)
    with pytest.raises(ValueError, match="one \\[C, H, W\\] image"):
        RandAugmentTransform()(torch.zeros(1, 3, 4, 4))
