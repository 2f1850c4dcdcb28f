"""CutMix: the original's weight is the exact unmixed area, boxes follow Composer's arithmetic, draws are keyed."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.algorithms.cutmix import (
    CutMix,
    CutMixParams,
    cutmix_apply,
    cutmix_batch,
    cutmix_boxes,
    cutmix_params,
    cutmix_targets,
)
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, StepCtx
from composer_fn.core.time import Timestamp
from composer_fn.testing import CHECKS, make_setup, train_steps

seeds = st.integers(0, 2**32 - 1)
sizes = st.integers(1, 7)
sides = st.integers(1, 9)
classes = st.integers(2, 6)
alphas = st.floats(0.05, 4.0)
DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32)


def _images(
    seed: int, batch: int, height: int, width: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    x = R.uniform(R.fold_in(R.key(seed), 0), (batch, 2, height, width))
    return (x * 255).to(torch.uint8) if dtype == torch.uint8 else x.to(dtype)


def _labels(seed: int, batch: int, num_classes: int) -> torch.Tensor:
    return R.randint(R.fold_in(R.key(seed), 1), 0, num_classes, (batch,))


def _reference_boxes(key, batch, cutmix_lambda, height, width, uniform_sampling):
    """Composer's _rand_bbox, example by example on Python ints, fed the same centre words."""
    lams = [float(v) for v in cutmix_lambda.reshape(-1)]
    words = R.bits(key, (batch + 2 * len(lams),))[batch:].reshape(-1, 2).tolist()
    boxes = []
    for lam, (row_word, col_word) in zip(lams, words, strict=True):
        ratio = math.sqrt(1.0 - lam)
        box = []
        for word, size in ((row_word, height), (col_word, width)):
            cut = int(size * ratio)
            if uniform_sampling:
                low, high = -cut // 2, size + cut // 2
                centre = low + ((word * (high - low)) >> 32)
            else:
                centre = (word * size) >> 32
            box.append((min(max(centre - cut // 2, 0), size), min(max(centre + cut // 2, 0), size)))
        (x1, x2), (y1, y2) = box
        boxes.append([x1, y1, x2, y2])
    return boxes


def _reference_paste(input: torch.Tensor, params: CutMixParams) -> torch.Tensor:
    """CutMix by slicing, one example at a time."""
    boxes = params.bbox.reshape(-1, 4).tolist()
    out = input.clone()
    for b in range(input.shape[0]):
        x1, y1, x2, y2 = boxes[b if len(boxes) > 1 else 0]
        out[b, ..., x1:x2, y1:y2] = input[int(params.indices[b]), ..., x1:x2, y1:y2]
    return out


@given(seeds, sizes, sides, sides, alphas, st.booleans(), st.booleans())
def test_boxes_follow_composers_arithmetic_per_example(
    seed, batch, height, width, alpha, uniform, per_sample
):
    key = R.key(seed)
    params = cutmix_params(
        key, batch, height, width, alpha=alpha, uniform_sampling=uniform, per_sample=per_sample
    )
    from composer_fn.algorithms.cutmix import draw_cutmix_lambda

    lam = draw_cutmix_lambda(R.to_host(key), alpha, batch if per_sample else None)
    expected = _reference_boxes(key, batch, lam, height, width, uniform)
    assert params.bbox.reshape(-1, 4).tolist() == expected
    assert params.bbox.shape == ((batch, 4) if per_sample else (4,))
    assert torch.equal(params.indices, R.permutation(key, batch))


@given(seeds, st.integers(2, 7), sides, sides, alphas, st.booleans(), st.booleans())
def test_area_is_one_minus_the_exactly_pasted_fraction(
    seed, batch, height, width, alpha, uniform, per_sample
):
    params = cutmix_params(
        R.key(seed), batch, height, width, alpha=alpha, uniform_sampling=uniform, per_sample=per_sample
    )
    # A derangement makes every pasted pixel visible: it comes from another example.
    params = params._replace(indices=torch.roll(torch.arange(batch), 1))
    ids = torch.arange(batch, dtype=torch.float32).reshape(batch, 1, 1, 1).expand(batch, 2, height, width)
    pasted = (cutmix_apply(ids, params) != ids).all(dim=1).sum(dim=(1, 2))
    expected = torch.tensor([1.0 - int(n) / (height * width) for n in pasted], dtype=torch.float32)
    area = params.area.expand(batch) if not per_sample else params.area
    assert torch.equal(area, expected)


@given(seeds, sizes, sides, sides, classes, alphas, st.booleans(), st.booleans())
def test_mixed_targets_sum_to_one_and_weigh_the_original_by_its_area(
    seed, batch, height, width, num_classes, alpha, uniform, per_sample
):
    x, y = _images(seed, batch, height, width), _labels(seed, batch, num_classes)
    _, mixed, area, _ = cutmix_batch(
        x,
        y,
        alpha=alpha,
        uniform_sampling=uniform,
        key=R.key(seed),
        num_classes=num_classes,
        per_sample=per_sample,
    )
    torch.testing.assert_close(mixed.sum(dim=1), torch.ones(batch), rtol=0, atol=1e-6)
    one_hot = F.one_hot(y, num_classes).float()
    indices = R.permutation(R.key(seed), batch)
    weight = area.reshape(-1, 1)
    torch.testing.assert_close(mixed, weight * one_hot + (1 - weight) * one_hot[indices], rtol=0, atol=1e-6)


@given(seeds, sizes, sides, sides, classes, alphas, st.booleans())
def test_per_sample_cutmix_equals_a_loop_over_examples(
    seed, batch, height, width, num_classes, alpha, uniform
):
    x, y = _images(seed, batch, height, width), _labels(seed, batch, num_classes)
    params = cutmix_params(
        R.key(seed), batch, height, width, alpha=alpha, uniform_sampling=uniform, per_sample=True
    )
    assert torch.equal(cutmix_apply(x, params), _reference_paste(x, params))
    one_hot = F.one_hot(y, num_classes).float()
    expected = torch.stack(
        [
            float(params.area[b]) * one_hot[b] + (1 - float(params.area[b])) * one_hot[int(params.indices[b])]
            for b in range(batch)
        ]
    )
    torch.testing.assert_close(cutmix_targets(y, params, num_classes), expected, rtol=0, atol=1e-6)


@given(seeds, sizes, sides, sides, alphas)
def test_batch_mode_pastes_the_same_box_into_every_example(seed, batch, height, width, alpha):
    x = _images(seed, batch, height, width)
    params = cutmix_params(R.key(seed), batch, height, width, alpha=alpha)
    assert params.bbox.shape == (4,) and params.area.shape == ()
    assert torch.equal(cutmix_apply(x, params), _reference_paste(x, params))


@given(seeds, sizes, sides, sides, alphas, st.sampled_from(DTYPES))
def test_the_sliced_paste_of_one_box_equals_the_masked_paste_of_that_box_per_example(
    seed, batch, height, width, alpha, dtype
):
    x = _images(seed, batch, height, width, dtype)
    params = cutmix_params(R.key(seed), batch, height, width, alpha=alpha)
    per_example = params._replace(bbox=params.bbox.expand(batch, 4).clone())
    assert torch.equal(cutmix_apply(x, params), cutmix_apply(x, per_example))


@given(seeds, sizes, sides, sides, classes, st.booleans())
def test_lambda_one_and_an_empty_box_leave_the_batch_unchanged(
    seed, batch, height, width, num_classes, per_sample
):
    x, y = _images(seed, batch, height, width), _labels(seed, batch, num_classes)
    ratio = torch.zeros((batch,) if per_sample else (), dtype=torch.float64)
    params = cutmix_boxes(R.key(seed), batch, height, width, ratio)
    assert torch.equal(cutmix_apply(x, params), x)
    assert bool((params.area == 1).all())
    assert torch.equal(cutmix_targets(y, params, num_classes), F.one_hot(y, num_classes).float())
    mixed_x, mixed_y, area, _ = cutmix_batch(
        x, y, bbox=(1, 0, 1, width), key=R.key(seed), num_classes=num_classes
    )
    assert torch.equal(mixed_x, x) and float(area) == 1.0
    assert torch.equal(mixed_y, F.one_hot(y, num_classes).float())


@given(seeds, sizes, sides, sides, alphas, st.booleans())
def test_the_same_key_gives_the_same_draws_and_other_keys_other_draws(
    seed, batch, height, width, alpha, per_sample
):
    first = cutmix_params(R.key(seed), 64, 16, 16, alpha=alpha, per_sample=per_sample)
    second = cutmix_params(R.key(seed), 64, 16, 16, alpha=alpha, per_sample=per_sample)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    other = cutmix_params(R.key(seed ^ 1), 64, 16, 16, alpha=alpha, per_sample=per_sample)
    assert not torch.equal(first.indices, other.indices)


@given(seeds, sizes, sides, sides, classes, st.booleans())
def test_cutmix_batch_leaves_its_inputs_unchanged(seed, batch, height, width, num_classes, per_sample):
    x, y = _images(seed, batch, height, width), _labels(seed, batch, num_classes)
    copies, versions = (x.clone(), y.clone()), (x._version, y._version)
    cutmix_batch(x, y, key=R.key(seed), num_classes=num_classes, per_sample=per_sample)
    assert torch.equal(x, copies[0]) and torch.equal(y, copies[1])
    assert (x._version, y._version) == versions


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@given(seed=seeds, batch=sizes, height=sides, width=sides, per_sample=st.booleans())
def test_pasting_keeps_the_dtype_and_moves_values_exactly(dtype, seed, batch, height, width, per_sample):
    x = _images(seed, batch, height, width, dtype)
    params = cutmix_params(R.key(seed), batch, height, width, per_sample=per_sample)
    out = cutmix_apply(x, params)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, _reference_paste(x, params))


@given(seeds, sizes, st.integers(1, 5), st.integers(2, 6), st.booleans())
def test_dense_targets_get_the_box_pasted(seed, batch, size, num_classes, per_sample):
    x = _images(seed, batch, size, size + 1)
    masks = R.randint(R.fold_in(R.key(seed), 2), 0, num_classes, (batch, size, size + 1))
    mixed_x, mixed_masks, _, bbox = cutmix_batch(x, masks, key=R.key(seed), per_sample=per_sample)
    params = cutmix_params(R.key(seed), batch, size, size + 1, per_sample=per_sample)
    assert torch.equal(mixed_masks, _reference_paste(masks, params)) and mixed_masks.dtype == masks.dtype
    assert torch.equal(bbox, params.bbox)


@given(seeds, sizes, st.integers(2, 6), alphas)
def test_the_interpolated_loss_equals_the_loss_on_area_mixed_one_hot_targets(seed, batch, num_classes, alpha):
    logits = R.normal(R.fold_in(R.key(seed), 7), (batch, num_classes), dtype=torch.float64)
    y = _labels(seed, batch, num_classes)
    params = cutmix_params(R.key(seed), batch, 6, 6, alpha=alpha)
    algorithm = CutMix(interpolate_loss=True)
    ctx = StepCtx(
        batch=(_images(seed, batch, 6, 6), y),
        key=R.key(seed),
        loss_fn=lambda outputs, batch: F.cross_entropy(outputs, batch[1]),
        outputs=logits,
        loss=F.cross_entropy(logits, y),
        scratch={"cutmix": params},
    )
    _, ctx = algorithm.traced_hooks()[Event.BEFORE_BACKWARD](None, ctx)
    mixed = cutmix_targets(y, params, num_classes).double()
    torch.testing.assert_close(ctx.loss, F.cross_entropy(logits, mixed))


def test_interpolate_loss_trains_like_mixed_targets_for_cross_entropy() -> None:
    _, mixed = train_steps(make_setup([CutMix(alpha=1.0)], seed=5))
    _, interpolated = train_steps(make_setup([CutMix(alpha=1.0, interpolate_loss=True)], seed=5))
    torch.testing.assert_close(torch.stack(mixed), torch.stack(interpolated), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("per_sample", [False, True])
def test_the_algorithm_draws_exactly_what_cutmix_params_draws_from_the_step_key(per_sample: bool) -> None:
    algorithm = CutMix(alpha=0.7, uniform_sampling=True, per_sample=per_sample)
    setup = make_setup([algorithm], seed=3, steps=1)
    plan = make_plan(setup.algorithms)
    _, state = plan.host[Event.BATCH_START][0](setup.static, setup.state, Timestamp(), BatchMeta(8))
    step_key = R.fold_in(R.key(3), 0)
    ctx = StepCtx(batch=setup.batches[0], key=step_key, loss_fn=lambda o, b: o.sum())
    after, ctx = plan.hooks[Event.BEFORE_FORWARD][0](state, ctx)
    expected = cutmix_params(
        R.fold_in(step_key, R.name_to_int("cutmix")),
        8,
        8,
        8,
        alpha=0.7,
        uniform_sampling=True,
        per_sample=per_sample,
    )
    drawn = ctx.scratch["cutmix"]
    assert all(torch.equal(a, b) for a, b in zip(drawn, expected, strict=True))
    assert torch.equal(ctx.batch[0], cutmix_apply(setup.batches[0][0], expected))
    # Per-example draws stay for the step's microbatches and leave the state at BATCH_END, so its shape at rest
    # does not depend on the batch size.
    assert after.algos["cutmix"].shape == ((8,) if per_sample else ())
    _, rest = run_host_event(Event.BATCH_END, plan, setup.static, after, Timestamp(), BatchMeta(8))
    assert rest.algos["cutmix"].shape == ((0,) if per_sample else ())



@pytest.mark.slow
@pytest.mark.parametrize(("per_sample", "uniform"), [(False, False), (True, True)])
def test_compiled_draws_and_paste_equal_eager_bitwise(
    fresh_compiler, per_sample: bool, uniform: bool
) -> None:
    x = _images(1, 6, 7, 9, torch.uint8)
    ratio = torch.tensor([0.3, 0.9, 0.0, 1.0, 0.55, 0.71] if per_sample else 0.6, dtype=torch.float64)

    def mix(key: torch.Tensor, input: torch.Tensor, ratio: torch.Tensor) -> tuple[torch.Tensor, CutMixParams]:
        params = cutmix_boxes(key, 6, 7, 9, ratio, uniform_sampling=uniform)
        return cutmix_apply(input, params), params

    compiled = torch.compile(mix, backend="aot_eager", fullgraph=True, dynamic=False)
    for seed in (0, 1):
        eager_out, eager_params = mix(R.key(seed), x, ratio)
        compiled_out, compiled_params = compiled(R.key(seed), x, ratio)
        assert torch.equal(eager_out, compiled_out)
        assert all(torch.equal(a, b) for a, b in zip(eager_params, compiled_params, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("algorithm", [CutMix(), CutMix(per_sample=True)], ids=repr)
def test_cutmix_honours_the_contract(fresh_compiler, algorithm: CutMix, check) -> None:
    check(algorithm)


def test_bad_arguments_name_the_argument_and_value() -> None:
    x, y = _images(0, 4, 5, 5), _labels(0, 4, 3)
    with pytest.raises(ValueError, match="alpha=-1"):
        CutMix(alpha=-1)
    with pytest.raises(ValueError, match="per_sample=True with interpolate_loss=True"):
        CutMix(per_sample=True, interpolate_loss=True)
    with pytest.raises(ValueError, match="key is required"):
        cutmix_batch(x, y, num_classes=3)
    with pytest.raises(ValueError, match="num_classes"):
        cutmix_batch(x, y, key=R.key(0))
    with pytest.raises(ValueError, match="length or bbox"):
        cutmix_batch(x, y, length=0.5, bbox=(0, 0, 1, 1), key=R.key(0), num_classes=3)
    with pytest.raises(ValueError, match="bbox=.*must satisfy"):
        cutmix_batch(x, y, bbox=(0, 0, 6, 1), key=R.key(0), num_classes=3)
    with pytest.raises(ValueError, match="length=1.5"):
        cutmix_batch(x, y, length=1.5, key=R.key(0), num_classes=3)
    with pytest.raises(ValueError, match="indices of shape"):
        cutmix_batch(x, y, bbox=(0, 0, 1, 1), indices=torch.arange(3), num_classes=3)
    with pytest.raises(ValueError, match="cut_ratio of shape"):
        cutmix_boxes(R.key(0), 4, 5, 5, torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="height=0"):
        cutmix_params(R.key(0), 4, 0, 5)


def test_length_sets_the_box_sides_as_a_fraction_of_height_and_width() -> None:
    params = cutmix_params(R.key(2), 3, 10, 20, length=0.4, per_sample=True)
    rows = params.bbox[:, 2] - params.bbox[:, 0]
    cols = params.bbox[:, 3] - params.bbox[:, 1]
    # int(0.4 * 10) = 4 and int(0.4 * 20) = 8, before clipping at the border.
    assert bool((rows <= 4).all() and (cols <= 8).all())
    inside = (params.bbox[:, 0] > 0) & (params.bbox[:, 2] < 10)
    assert bool((rows[inside] == 4).all())


@pytest.mark.parametrize(("dtype", "side"), [(torch.float32, 512), (torch.uint8, 1024), (torch.uint8, 512)])
def test_a_batch_beyond_the_caches_is_pasted_like_a_small_one(dtype, side) -> None:
    # 10.5 MB (float32 at 512, uint8 at 1024) is pasted in tiles of examples; uint8 at 512 stays below the
    # threshold and is pasted whole.
    x = _images(5, 5, side, side, dtype)
    params = cutmix_params(R.key(5), 5, side, side, alpha=1.0, per_sample=True)
    assert torch.equal(cutmix_apply(x, params), _reference_paste(x, params))
