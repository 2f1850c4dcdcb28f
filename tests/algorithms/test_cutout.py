"""CutOut: exactly the holes are zeroed, holes follow Composer's arithmetic, draws are keyed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.algorithms.cutout import (
    CutOut,
    CutOutParams,
    box_mask,
    cutout_apply,
    cutout_batch,
    cutout_params,
)
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.event import Event
from composer_fn.core.state import StepCtx
from composer_fn.testing import CHECKS, make_setup

seeds = st.integers(0, 2**32 - 1)
sizes = st.integers(1, 6)
sides = st.integers(1, 10)
holes = st.integers(0, 3)
lengths = st.floats(0.0, 1.0)
DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32)


def _images(
    seed: int, batch: int, height: int, width: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    # No zero pixel, so a zero in the output can only come from a hole.
    x = R.uniform(R.fold_in(R.key(seed), 0), (batch, 2, height, width), low=1.0, high=2.0)
    return (x * 100).to(torch.uint8) if dtype == torch.uint8 else x.to(dtype)


def _reference_boxes(key, batch, height, width, num_holes, length, uniform, per_sample):
    """Composer's hole arithmetic on Python ints, fed the same centre draws."""
    side = int(min(height, width) * length)
    shape = (batch, num_holes) if per_sample else (num_holes,)
    words = R.bits(key, (2,) + shape)

    def randint(word: int, low: int, high: int) -> int:
        return low + ((word * (high - low)) >> 32)

    if uniform:
        rows = [randint(w, -side // 2, height + side // 2) for w in words[0].reshape(-1).tolist()]
        cols = [randint(w, -side // 2, width + side // 2) for w in words[1].reshape(-1).tolist()]
    else:
        rows = [randint(w, 0, height) for w in words[0].reshape(-1).tolist()]
        cols = [randint(w, 0, width) for w in words[1].reshape(-1).tolist()]

    def clip(value: int, size: int) -> int:
        return min(max(value, 0), size)

    return [
        [
            clip(y - side // 2, height),
            clip(x - side // 2, width),
            clip(y + side // 2, height),
            clip(x + side // 2, width),
        ]
        for y, x in zip(rows, cols, strict=True)
    ]


def _reference_cutout(input: torch.Tensor, params: CutOutParams) -> torch.Tensor:
    """CutOut by slicing, one image and one hole at a time."""
    out = input.clone()
    per_sample = params.boxes.dim() == 3
    for b in range(input.shape[0]):
        for y1, x1, y2, x2 in (params.boxes[b] if per_sample else params.boxes).tolist():
            out[b, ..., y1:y2, x1:x2] = 0
    return out


@given(seeds, sizes, sides, sides, holes, lengths, st.booleans(), st.booleans())
def test_holes_follow_composers_arithmetic(
    seed, batch, height, width, num_holes, length, uniform, per_sample
):
    key = R.key(seed)
    params = cutout_params(
        key,
        batch,
        height,
        width,
        num_holes=num_holes,
        length=length,
        uniform_sampling=uniform,
        per_sample=per_sample,
    )
    assert params.boxes.shape == ((batch, num_holes, 4) if per_sample else (num_holes, 4))
    expected = _reference_boxes(key, batch, height, width, num_holes, length, uniform, per_sample)
    assert params.boxes.reshape(-1, 4).tolist() == expected


@given(seeds, sizes, sides, sides, holes, lengths, st.booleans(), st.booleans())
def test_exactly_the_hole_pixels_are_zeroed_and_the_rest_is_unchanged(
    seed, batch, height, width, num_holes, length, uniform, per_sample
):
    x = _images(seed, batch, height, width)
    params = cutout_params(
        R.key(seed),
        batch,
        height,
        width,
        num_holes=num_holes,
        length=length,
        uniform_sampling=uniform,
        per_sample=per_sample,
    )
    out = cutout_apply(x, params)
    assert torch.equal(out, _reference_cutout(x, params))
    inside = box_mask(params.boxes, height, width).any(dim=-3)
    inside = inside.unsqueeze(1) if per_sample else inside
    assert torch.equal(out == 0, inside.expand_as(x))
    assert torch.equal(out[~inside.expand_as(x)], x[~inside.expand_as(x)])


@given(seeds, st.integers(2, 6), sides, sides, st.integers(1, 3), lengths)
def test_batch_mode_cuts_the_same_holes_from_every_image(seed, batch, height, width, num_holes, length):
    x = _images(seed, batch, height, width)
    out = cutout_batch(x, num_holes, length, key=R.key(seed))
    assert torch.equal(out == 0, (out[:1] == 0).expand_as(out))


@given(seeds, sizes, sides, sides, st.booleans())
def test_no_hole_and_zero_length_leave_the_images_unchanged(seed, batch, height, width, per_sample):
    x = _images(seed, batch, height, width)
    assert torch.equal(cutout_batch(x, num_holes=0, key=R.key(seed), per_sample=per_sample), x)
    assert torch.equal(cutout_batch(x, length=0.0, key=R.key(seed), per_sample=per_sample), x)


@given(seeds, sides, sides, lengths)
def test_a_single_image_is_cut_like_a_batch_of_one(seed, height, width, length):
    x = _images(seed, 1, height, width)
    assert torch.equal(
        cutout_batch(x[0], length=length, key=R.key(seed)), cutout_batch(x, length=length, key=R.key(seed))[0]
    )


@given(seeds, st.booleans())
def test_the_same_key_gives_the_same_holes_and_other_keys_other_holes(seed, per_sample):
    first = cutout_params(R.key(seed), 16, 32, 32, num_holes=4, per_sample=per_sample)
    second = cutout_params(R.key(seed), 16, 32, 32, num_holes=4, per_sample=per_sample)
    assert torch.equal(first.boxes, second.boxes)
    other = cutout_params(R.key(seed ^ 1), 16, 32, 32, num_holes=4, per_sample=per_sample)
    assert not torch.equal(first.boxes, other.boxes)


@given(seeds, sizes, sides, sides, st.booleans())
def test_cutout_batch_leaves_its_input_unchanged(seed, batch, height, width, per_sample):
    x = _images(seed, batch, height, width)
    copy, version = x.clone(), x._version
    cutout_batch(x, num_holes=2, key=R.key(seed), per_sample=per_sample)
    assert torch.equal(x, copy) and x._version == version


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@given(seed=seeds, batch=sizes, height=sides, width=sides, per_sample=st.booleans())
def test_cutout_keeps_the_dtype_and_shape(dtype, seed, batch, height, width, per_sample):
    x = _images(seed, batch, height, width, dtype)
    params = cutout_params(R.key(seed), batch, height, width, num_holes=2, per_sample=per_sample)
    out = cutout_apply(x, params)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, _reference_cutout(x, params))


def test_nan_inside_a_hole_becomes_zero() -> None:
    x = torch.full((1, 1, 4, 4), float("nan"))
    out = cutout_apply(x, CutOutParams(torch.tensor([[0, 0, 2, 2]])))
    assert torch.equal(out[0, 0, :2, :2], torch.zeros(2, 2))
    assert bool(out[0, 0, 2:, 2:].isnan().all())


def test_the_algorithm_cuts_what_cutout_params_draws_from_the_step_key() -> None:
    algorithm = CutOut(num_holes=2, length=0.4, uniform_sampling=True, per_sample=True)
    setup = make_setup([algorithm], seed=4, steps=1)
    plan = make_plan(setup.algorithms)
    step_key = R.fold_in(R.key(4), 0)
    ctx = StepCtx(batch=setup.batches[0], key=step_key, loss_fn=lambda o, b: o.sum())
    _, ctx = plan.hooks[Event.AFTER_DATALOADER][0](setup.state, ctx)
    expected = cutout_params(
        R.fold_in(step_key, R.name_to_int("cutout")),
        8,
        8,
        8,
        num_holes=2,
        length=0.4,
        uniform_sampling=True,
        per_sample=True,
    )
    assert torch.equal(ctx.batch[0], cutout_apply(setup.batches[0][0], expected))



@pytest.mark.slow
@pytest.mark.parametrize(("per_sample", "uniform"), [(False, False), (True, True)])
def test_compiled_cutout_equals_eager_bitwise(fresh_compiler, per_sample: bool, uniform: bool) -> None:
    x = _images(2, 5, 9, 7, torch.bfloat16)

    def cut(key: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
        params = cutout_params(
            key, 5, 9, 7, num_holes=3, length=0.5, uniform_sampling=uniform, per_sample=per_sample
        )
        return cutout_apply(input, params)

    compiled = torch.compile(cut, backend="aot_eager", fullgraph=True, dynamic=False)
    for seed in (0, 1):
        assert torch.equal(cut(R.key(seed), x), compiled(R.key(seed), x))


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("algorithm", [CutOut(), CutOut(per_sample=True)], ids=repr)
def test_cutout_honours_the_contract(fresh_compiler, algorithm: CutOut, check) -> None:
    check(algorithm)


def test_bad_arguments_name_the_argument_and_value() -> None:
    with pytest.raises(ValueError, match="num_holes=-1"):
        CutOut(num_holes=-1)
    with pytest.raises(ValueError, match="length=1.5"):
        CutOut(length=1.5)
    with pytest.raises(ValueError, match="height=0"):
        cutout_params(R.key(0), 2, 0, 4)
    with pytest.raises(ValueError, match="expected one image"):
        cutout_batch(torch.zeros(2, 2), key=R.key(0))
    with pytest.raises(ValueError, match="per-sample holes for 3 images"):
        cutout_apply(torch.zeros(2, 1, 4, 4), cutout_params(R.key(0), 3, 4, 4, per_sample=True))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8], ids=str)
def test_integer_inputs_other_than_uint8_images_are_refused_naming_the_dtype(dtype) -> None:
    tokens = torch.arange(2 * 16 * 16).reshape(2, 1, 16, 16).to(dtype)
    with pytest.raises(TypeError, match=f"input of dtype {dtype}: CutOut zeroes pixels of floating-point or uint8"):
        cutout_batch(tokens, key=R.key(0))
    with pytest.raises(TypeError, match=f"input of dtype {dtype}"):
        CutOut().transform(R.key(0), tokens)
