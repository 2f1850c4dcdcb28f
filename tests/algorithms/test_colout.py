"""ColOut: the kept rows and columns have Composer's counts, stay in order, and are drawn from the key."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from PIL import Image

from composer_fn.algorithms.colout import (
    ColOut,
    ColOutParams,
    ColOutTransform,
    colout_apply,
    colout_batch,
    colout_params,
)
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.core.event import Event
from composer_fn.core.state import StepCtx
from composer_fn.testing import make_setup

seeds = st.integers(0, 2**32 - 1)
sizes = st.integers(1, 5)
sides = st.integers(2, 12)
fractions = st.floats(0.0, 1.0, exclude_max=True)
DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32)


def _pixel_ids(batch: int, height: int, width: int) -> torch.Tensor:
    """Images whose pixel (h, w) holds h * width + w, so an output pixel says where it came from."""
    ids = torch.arange(height * width, dtype=torch.int64).reshape(1, 1, height, width)
    return ids.expand(batch, 2, height, width).clone()


@given(seeds, sizes, sides, sides, fractions, fractions)
def test_the_output_keeps_composers_counts_of_rows_and_columns_in_order(
    seed, batch, height, width, p_row, p_col
):
    kept_rows, kept_cols = int((1 - p_row) * height), int((1 - p_col) * width)
    assume(kept_rows >= 1 and kept_cols >= 1)
    x = _pixel_ids(batch, height, width)
    out = colout_batch(x, p_row, p_col, key=R.key(seed))
    assert out.shape == (batch, 2, kept_rows, kept_cols)
    rows, cols = out[0, 0, :, 0] // width, out[0, 0, 0, :] % width
    assert bool((rows[1:] > rows[:-1]).all()) and bool((cols[1:] > cols[:-1]).all())
    assert torch.equal(out, x[:, :, rows][:, :, :, cols])


@given(seeds, sides, sides, fractions, st.booleans(), st.data())
def test_fractions_that_keep_no_row_or_column_are_refused(seed, height, width, other, on_rows, data):
    # Drawn where a side keeps nothing (a fraction above 1 - 1/side), so that few draws are thrown away.
    side = height if on_rows else width
    empty = data.draw(st.floats(1 - 1 / side, 1.0, exclude_min=True, exclude_max=True))
    p_row, p_col = (empty, other) if on_rows else (other, empty)
    assume(int((1 - p_row) * height) < 1 or int((1 - p_col) * width) < 1)
    with pytest.raises(ValueError, match=r"p_(row|col)=.* keeps int\(\(1 - p_(row|col)\) \* (height|width)\) = 0"):
        colout_params(R.key(seed), height, width, p_row=p_row, p_col=p_col)


@given(seeds, sizes, sides, sides, fractions, fractions)
def test_colout_equals_picking_each_kept_pixel(seed, batch, height, width, p_row, p_col):
    assume(int((1 - p_row) * height) >= 1 and int((1 - p_col) * width) >= 1)
    x = R.normal(R.key(seed), (batch, 2, height, width))
    params = colout_params(R.key(seed), height, width, p_row=p_row, p_col=p_col)
    out = colout_apply(x, params)
    rows, cols = params.rows.tolist(), params.cols.tolist()
    assert sorted(set(rows)) == rows and sorted(set(cols)) == cols
    expected = torch.zeros(batch, 2, len(rows), len(cols))
    for i, row in enumerate(rows):
        for j, col in enumerate(cols):
            expected[:, :, i, j] = x[:, :, row, col]
    assert torch.equal(out, expected)


@given(seeds, sizes, sides, sides)
def test_dropping_nothing_is_the_identity(seed, batch, height, width):
    x = R.normal(R.key(seed), (batch, 3, height, width))
    assert torch.equal(colout_batch(x, 0.0, 0.0, key=R.key(seed)), x)


@given(seeds, st.floats(0.05, 0.6), st.floats(0.05, 0.6))
def test_the_same_key_keeps_the_same_rows_and_other_keys_others(seed, p_row, p_col):
    first = colout_params(R.key(seed), 64, 64, p_row=p_row, p_col=p_col)
    second = colout_params(R.key(seed), 64, 64, p_row=p_row, p_col=p_col)
    assert torch.equal(first.rows, second.rows) and torch.equal(first.cols, second.cols)
    other = colout_params(R.key(seed ^ 1), 64, 64, p_row=p_row, p_col=p_col)
    assert not (torch.equal(first.rows, other.rows) and torch.equal(first.cols, other.cols))


@given(seeds, sizes, sides, sides)
def test_colout_batch_leaves_its_inputs_unchanged(seed, batch, height, width):
    x, masks = R.normal(R.key(seed), (batch, 3, height, width)), _pixel_ids(batch, height, width)[:, 0]
    copies, versions = (x.clone(), masks.clone()), (x._version, masks._version)
    colout_batch((x, masks), 0.3, 0.3, key=R.key(seed))
    assert torch.equal(x, copies[0]) and torch.equal(masks, copies[1])
    assert (x._version, masks._version) == versions


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@given(seed=seeds, batch=sizes, height=sides, width=sides)
def test_colout_keeps_the_dtype(dtype, seed, batch, height, width):
    x = _pixel_ids(batch, height, width).to(dtype)
    out = colout_batch(x, 0.25, 0.25, key=R.key(seed))
    assert out.dtype == dtype
    params = colout_params(R.key(seed), height, width, p_row=0.25, p_col=0.25)
    assert torch.equal(out, x[:, :, params.rows][:, :, :, params.cols])


@given(seeds, sizes, st.integers(2, 8), st.integers(2, 8))
def test_image_like_targets_lose_the_same_rows_and_columns(seed, batch, height, width):
    x, masks = _pixel_ids(batch, height, width).float(), _pixel_ids(batch, height, width)[:, 0]
    labels = torch.arange(batch)
    out, out_masks = colout_batch((x, masks), 0.4, 0.4, key=R.key(seed))
    assert torch.equal(out_masks, out[:, 0].long())
    out, kept_labels = colout_batch((x, labels), 0.4, 0.4, key=R.key(seed))
    assert kept_labels is labels
    _, unchanged = colout_batch((x, masks), 0.4, 0.4, resize_target=False, key=R.key(seed))
    assert unchanged is masks
    single, single_mask = colout_batch([x[0], masks[0]], 0.4, 0.4, key=R.key(seed))
    assert torch.equal(single_mask, single[0].long())


def test_the_algorithm_drops_what_colout_params_draws_from_the_step_key() -> None:
    algorithm = ColOut(p_row=0.3, p_col=0.2)
    setup = make_setup([algorithm], seed=6, steps=1)
    plan = make_plan(setup.algorithms)
    step_key = R.fold_in(R.key(6), 0)
    x, y = setup.batches[0]
    masks = _pixel_ids(8, 8, 8)[:, 0]
    ctx = StepCtx(batch=(x, masks), key=step_key, loss_fn=lambda o, b: o.sum())
    _, ctx = plan.hooks[Event.AFTER_DATALOADER][0](setup.state, ctx)
    expected = colout_params(R.fold_in(step_key, R.name_to_int("colout")), 8, 8, p_row=0.3, p_col=0.2)
    assert torch.equal(ctx.batch[0], colout_apply(x, expected))
    assert torch.equal(ctx.batch[1], colout_apply(masks, expected))
    ctx = StepCtx(batch=(x, y), key=step_key, loss_fn=lambda o, b: o.sum())
    _, ctx = plan.hooks[Event.AFTER_DATALOADER][0](setup.state, ctx)
    assert ctx.batch[1] is y


def test_the_transform_is_deterministic_per_seed_and_call() -> None:
    image = _pixel_ids(1, 10, 10)[0].float()
    first = [ColOutTransform(0.3, 0.3, seed=1)(image) for _ in range(2)]
    transform = ColOutTransform(0.3, 0.3, seed=1)
    calls = [transform(image) for _ in range(3)]
    assert torch.equal(first[0], first[1]) and torch.equal(calls[0], first[0])
    assert not torch.equal(calls[0], calls[1])
    keyed = colout_batch(image, 0.3, 0.3, key=R.fold_in(R.fold_in(R.key(1), 0), 2))
    assert torch.equal(calls[2], keyed)
    assert not torch.equal(ColOutTransform(0.3, 0.3, seed=2)(image), first[0])


def test_the_transform_handles_pil_images_like_tensors() -> None:
    pixels = (np.arange(9 * 7 * 3) % 251).astype(np.uint8).reshape(9, 7, 3)
    image, mask = Image.fromarray(pixels), Image.fromarray(pixels[:, :, 0])
    out_image, out_mask = ColOutTransform(0.3, 0.4, seed=3)((image, mask))
    params = colout_params(R.fold_in(R.fold_in(R.key(3), 0), 0), 9, 7, p_row=0.3, p_col=0.4)
    expected = colout_apply(torch.from_numpy(pixels).permute(2, 0, 1), params)
    assert out_image.size == (int(0.6 * 7), int(0.7 * 9)) and out_image.mode == "RGB"
    assert np.array_equal(np.asarray(out_image), expected.permute(1, 2, 0).numpy())
    assert np.array_equal(np.asarray(out_mask), expected[0].numpy())



@pytest.mark.slow
def test_compiled_colout_equals_eager_bitwise(fresh_compiler) -> None:
    x = _pixel_ids(3, 11, 9).to(torch.float16)

    def drop(key: torch.Tensor, input: torch.Tensor) -> tuple[torch.Tensor, ColOutParams]:
        params = colout_params(key, 11, 9, p_row=0.3, p_col=0.15)
        return colout_apply(input, params), params

    compiled = torch.compile(drop, backend="aot_eager", fullgraph=True, dynamic=False)
    for seed in (0, 1):
        (eager, eager_params), (fast, fast_params) = drop(R.key(seed), x), compiled(R.key(seed), x)
        assert torch.equal(eager, fast)
        assert torch.equal(eager_params.rows, fast_params.rows) and torch.equal(
            eager_params.cols, fast_params.cols
        )



def test_bad_arguments_name_the_argument_and_value() -> None:
    with pytest.raises(ValueError, match="ColOutTransform"):
        ColOut(batch=False)
    with pytest.raises(ValueError, match="p_row=1.5"):
        ColOut(p_row=1.5)
    with pytest.raises(ValueError, match="p_col=-0.1"):
        colout_params(R.key(0), 4, 4, p_col=-0.1)
    with pytest.raises(ValueError, match="resize_target='yes'"):
        ColOut(resize_target="yes")
    with pytest.raises(ValueError, match="3 items"):
        colout_batch((torch.zeros(1, 4, 4),) * 3, key=R.key(0))
    with pytest.raises(ValueError, match=r"input of shape \(4,\): expected one image \[C, H, W\] or a batch"):
        colout_batch(torch.zeros(4), key=R.key(0))
