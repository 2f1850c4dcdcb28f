"""MixUp: targets stay distributions, mixing 0 is the identity, draws are keyed, the algorithm equals the functions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.algorithms import MixUp
from composer_fn.algorithms.mixup import draw_mixing, mixup_apply, mixup_targets
from composer_fn.core import random as R
from composer_fn.core.engine import make_plan
from composer_fn.functional import mixup_batch, mixup_params
from composer_fn.testing import CHECKS, make_setup, train_steps

seeds = st.integers(0, 2**32 - 1)
sizes = st.integers(1, 9)
classes = st.integers(2, 8)


def _batch(seed: int, batch: int, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = R.normal(R.fold_in(R.key(seed), 0), (batch, 2, 3, 3))
    y = R.randint(R.fold_in(R.key(seed), 1), 0, num_classes, (batch,))
    return x, y


@given(seeds, sizes, classes, st.floats(0.01, 4.0))
def test_mixed_targets_sum_to_one_and_mixing_keeps_the_original_dominant(seed, batch, num_classes, alpha) -> None:
    x, y = _batch(seed, batch, num_classes)
    _, mixed, mixing = mixup_batch(x, y, alpha=alpha, key=R.key(seed), num_classes=num_classes)
    torch.testing.assert_close(mixed.sum(dim=1), torch.ones(batch), rtol=0, atol=1e-6)
    assert 0.0 <= float(mixing) <= 0.5


@given(seeds, sizes, classes)
def test_zero_mixing_is_the_identity(seed, batch, num_classes) -> None:
    x, y = _batch(seed, batch, num_classes)
    mixed_x, mixed_y, _ = mixup_batch(x, y, mixing=0.0, key=R.key(seed), num_classes=num_classes)
    assert torch.equal(mixed_x, x)
    assert torch.equal(mixed_y, F.one_hot(y, num_classes).float())


@given(seeds, sizes, classes, st.floats(0.0, 1.0))
def test_mixed_inputs_follow_the_formula_and_lie_between_their_pair(seed, batch, num_classes, mixing) -> None:
    x, y = _batch(seed, batch, num_classes)
    indices = R.permutation(R.key(seed), batch)
    mixed_x, mixed_y, _ = mixup_batch(x, y, mixing=mixing, indices=indices, num_classes=num_classes)
    torch.testing.assert_close(mixed_x, (1 - mixing) * x + mixing * x[indices], rtol=1e-5, atol=1e-6)
    low, high = torch.minimum(x, x[indices]), torch.maximum(x, x[indices])
    assert (mixed_x >= low - 1e-6).all() and (mixed_x <= high + 1e-6).all()
    one_hot = F.one_hot(y, num_classes).float()
    torch.testing.assert_close(mixed_y, (1 - mixing) * one_hot + mixing * one_hot[indices], rtol=1e-5, atol=1e-6)


@given(seeds, sizes, st.floats(0.01, 4.0))
def test_the_same_key_gives_the_same_draws_and_other_keys_other_draws(seed, batch, alpha) -> None:
    first, second = mixup_params(R.key(seed), 64, alpha=alpha), mixup_params(R.key(seed), 64, alpha=alpha)
    assert torch.equal(first.mixing, second.mixing) and torch.equal(first.indices, second.indices)
    other = mixup_params(R.key(seed ^ 1), 64, alpha=alpha)
    assert not torch.equal(first.indices, other.indices)


@given(seeds, sizes, classes)
def test_mixup_batch_leaves_its_inputs_unchanged(seed, batch, num_classes) -> None:
    x, y = _batch(seed, batch, num_classes)
    copies, versions = (x.clone(), y.clone()), (x._version, y._version)
    mixup_batch(x, y, alpha=1.0, key=R.key(seed), num_classes=num_classes)
    assert torch.equal(x, copies[0]) and torch.equal(y, copies[1])
    assert (x._version, y._version) == versions


@given(seeds, sizes, classes, st.floats(0.0, 1.0))
def test_interpolated_loss_equals_the_loss_on_mixed_targets_for_cross_entropy(seed, batch, num_classes, mixing):
    logits = R.normal(R.fold_in(R.key(seed), 7), (batch, num_classes), dtype=torch.float64)
    y = R.randint(R.fold_in(R.key(seed), 8), 0, num_classes, (batch,))
    indices = R.permutation(R.key(seed), batch)
    one_hot = F.one_hot(y, num_classes).double()
    mixed = (1 - mixing) * one_hot + mixing * one_hot[indices]
    interpolated = (1 - mixing) * F.cross_entropy(logits, y) + mixing * F.cross_entropy(logits, y[indices])
    torch.testing.assert_close(F.cross_entropy(logits, mixed), interpolated)


@pytest.mark.parametrize("per_sample", [False, True])
def test_the_algorithm_draws_exactly_what_mixup_params_draws_from_the_step_key(per_sample: bool) -> None:
    algorithm = MixUp(alpha=0.4, per_sample=per_sample)
    setup = make_setup([algorithm], seed=3, steps=1)
    plan = make_plan(setup.algorithms)
    from composer_fn.core.event import Event
    from composer_fn.core.state import BatchMeta, StepCtx
    from composer_fn.core.time import Timestamp

    timestamp = Timestamp()
    _, state = plan.host[Event.BATCH_START][0](setup.static, setup.state, timestamp, BatchMeta(8))
    step_key = R.fold_in(R.key(3), 0)
    ctx = StepCtx(batch=setup.batches[0], key=step_key, loss_fn=lambda o, b: o.sum())
    _, ctx = plan.hooks[Event.BEFORE_FORWARD][0](state, ctx)
    expected = mixup_params(R.fold_in(step_key, R.name_to_int("mixup")), 8, alpha=0.4, per_sample=per_sample)
    assert torch.equal(state.algos["mixup"], expected.mixing)
    assert torch.equal(ctx.scratch["mixup"].indices, expected.indices)
    assert torch.equal(ctx.scratch["mixup"].mixing, expected.mixing)
    assert state.algos["mixup"].shape == ((8,) if per_sample else ())


@given(st.integers(0, 7), st.integers(1, 8))
def test_a_microbatch_reads_the_per_example_draws_at_its_place_in_the_global_batch(offset, size) -> None:
    from composer_fn.core.event import Event
    from composer_fn.core.state import BatchMeta, StepCtx
    from composer_fn.core.time import Timestamp

    size = min(size, 8 - offset)
    setup = make_setup([MixUp(alpha=0.4, per_sample=True)], seed=3, steps=1)
    plan = make_plan(setup.algorithms)
    _, state = plan.host[Event.BATCH_START][0](setup.static, setup.state, Timestamp(), BatchMeta(8))
    part = tuple(t[offset : offset + size] for t in setup.batches[0])
    ctx = StepCtx(batch=part, key=R.key(5), loss_fn=lambda o, b: o.sum(), offset=offset)
    _, ctx = plan.hooks[Event.BEFORE_FORWARD][0](state, ctx)
    assert torch.equal(ctx.scratch["mixup"].mixing, state.algos["mixup"][offset : offset + size])
    indices = ctx.scratch["mixup"].indices
    expected = mixup_apply(part[0], indices, state.algos["mixup"][offset : offset + size])
    assert torch.equal(ctx.batch[0], expected)


def test_interpolate_loss_trains_like_mixed_targets_for_cross_entropy() -> None:
    _, mixed = train_steps(make_setup([MixUp(alpha=1.0)], seed=5))
    _, interpolated = train_steps(make_setup([MixUp(alpha=1.0, interpolate_loss=True)], seed=5))
    torch.testing.assert_close(torch.stack(mixed), torch.stack(interpolated), rtol=1e-5, atol=1e-6)


def test_bad_arguments_name_the_argument_and_value() -> None:
    x, y = _batch(0, 4, 3)
    with pytest.raises(ValueError, match="alpha=-1"):
        MixUp(alpha=-1)
    with pytest.raises(ValueError, match="key is required"):
        mixup_batch(x, y, num_classes=3)
    with pytest.raises(ValueError, match="num_classes"):
        mixup_batch(x, y, key=R.key(0))
    with pytest.raises(ValueError, match="mixing=1.5"):
        mixup_batch(x, y, mixing=1.5, key=R.key(0), num_classes=3)
    with pytest.raises(ValueError, match="indices of shape"):
        mixup_batch(x, y, mixing=0.2, indices=torch.arange(3), num_classes=3)
    with pytest.raises(ValueError, match="per_sample=True with interpolate_loss=True"):
        MixUp(per_sample=True, interpolate_loss=True)
    with pytest.raises(ValueError, match="mixing of shape"):
        mixup_batch(x, y, mixing=torch.full((3,), 0.2), key=R.key(0), num_classes=3)
    with pytest.raises(ValueError, match=r"mixing\[1\]=1.5"):
        mixup_batch(x, y, mixing=torch.tensor([0.2, 1.5, 0.0, 0.1]), key=R.key(0), num_classes=3)
    with pytest.raises(TypeError, match="floating-point"):
        mixup_batch(y.reshape(4, 1).float().long(), y, key=R.key(0), num_classes=3)


@given(seeds, sizes, st.floats(0.01, 4.0))
def test_batch_mode_draws_one_mixing_from_the_host_key_as_before(seed, batch, alpha) -> None:
    drawn = mixup_params(R.key(seed), batch, alpha=alpha)
    assert drawn.mixing.shape == ()
    assert torch.equal(
        drawn.mixing, torch.tensor(draw_mixing(R.to_host(R.key(seed)), alpha), dtype=torch.float32)
    )


@given(seeds, sizes, classes, st.floats(0.01, 4.0))
def test_per_sample_targets_sum_to_one_and_each_original_stays_dominant(
    seed, batch, num_classes, alpha
) -> None:
    x, y = _batch(seed, batch, num_classes)
    _, mixed, mixing = mixup_batch(
        x, y, alpha=alpha, key=R.key(seed), num_classes=num_classes, per_sample=True
    )
    assert mixing.shape == (batch,)
    torch.testing.assert_close(mixed.sum(dim=1), torch.ones(batch), rtol=0, atol=1e-6)
    assert bool(((mixing >= 0) & (mixing <= 0.5)).all())


@given(seeds, st.integers(2, 9), classes, st.floats(0.01, 4.0))
def test_per_sample_mixup_equals_a_loop_over_examples(seed, batch, num_classes, alpha) -> None:
    x, y = _batch(seed, batch, num_classes)
    mixed_x, mixed_y, mixing = mixup_batch(
        x, y, alpha=alpha, key=R.key(seed), num_classes=num_classes, per_sample=True
    )
    indices = R.permutation(R.key(seed), batch)
    one_hot = F.one_hot(y, num_classes).float()
    for b in range(batch):
        weight, source = float(mixing[b]), int(indices[b])
        torch.testing.assert_close(mixed_x[b], (1 - weight) * x[b] + weight * x[source], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            mixed_y[b], (1 - weight) * one_hot[b] + weight * one_hot[source], rtol=1e-5, atol=1e-6
        )


@given(seeds, st.integers(2, 9), st.floats(0.0, 0.5))
def test_equal_per_sample_weights_give_the_batch_mode_result_bitwise(seed, batch, mixing) -> None:
    x, y = _batch(seed, batch, 4)
    indices = R.permutation(R.key(seed), batch)
    scalar, vector = torch.tensor(mixing), torch.full((batch,), mixing)
    assert torch.equal(mixup_apply(x, indices, scalar), mixup_apply(x, indices, vector))
    assert torch.equal(mixup_targets(y, indices, scalar, 4), mixup_targets(y, indices, vector, 4))


@given(seeds, st.integers(8, 16))
def test_per_sample_draws_differ_between_examples_and_keys(seed, batch) -> None:
    first = mixup_params(R.key(seed), batch, alpha=1.0, per_sample=True)
    assert torch.equal(first.mixing, mixup_params(R.key(seed), batch, alpha=1.0, per_sample=True).mixing)
    assert len(set(first.mixing.tolist())) == batch
    assert not torch.equal(
        first.mixing, mixup_params(R.key(seed ^ 1), batch, alpha=1.0, per_sample=True).mixing
    )



@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_per_sample_mixup_honours_the_contract(fresh_compiler, check) -> None:
    check(MixUp(per_sample=True))


@pytest.mark.slow
def test_compiled_per_sample_mixing_equals_eager_bitwise(fresh_compiler) -> None:
    x, y = _batch(3, 6, 5)
    mixing = mixup_params(R.key(3), 6, alpha=1.0, per_sample=True).mixing

    def mix(input, target, indices, mixing):
        return mixup_apply(input, indices, mixing), mixup_targets(target, indices, mixing, 5)

    compiled = torch.compile(mix, backend="aot_eager", fullgraph=True, dynamic=False)
    indices = R.permutation(R.key(3), 6)
    for eager, fast in zip(mix(x, y, indices, mixing), compiled(x, y, indices, mixing), strict=True):
        assert torch.equal(eager, fast)


@pytest.mark.parametrize("record", ["MixUp", "CutMix"])
@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("alpha", float("nan"), ValueError),
        ("alpha", float("inf"), ValueError),
        ("alpha", "0.2", ValueError),
        ("alpha", -0.1, ValueError),
        ("per_sample", "yes", TypeError),
        ("per_sample", 1, TypeError),
        ("interpolate_loss", "no", TypeError),
    ],
)
def test_bad_hyperparameters_of_the_label_mixing_records_are_refused_by_name(record, field, value, error) -> None:
    from composer_fn import algorithms as A

    with pytest.raises(error, match=f"{field}={value!r}"):
        getattr(A, record)(**{field: value})


def test_cutmix_uniform_sampling_must_be_a_bool() -> None:
    from composer_fn.algorithms import CutMix

    with pytest.raises(TypeError, match="uniform_sampling='yes' must be True or False"):
        CutMix(uniform_sampling="yes")


def test_a_label_beyond_the_classes_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"target holds class 4: class indices must lie in \[0, 3\]"):
        mixup_targets(torch.tensor([0, 4]), torch.tensor([1, 0]), 0.3, 4)
    with pytest.raises(ValueError, match=r"target holds class -1"):
        mixup_batch(R.uniform(R.key(0), (2, 3)), torch.tensor([-1, 1]), key=R.key(0), num_classes=4)


def test_an_integer_one_hot_target_is_mixed_as_probabilities_by_the_algorithm() -> None:
    from composer_fn.core.event import Event
    from composer_fn.core.state import StepCtx

    algorithm = MixUp(alpha=1.0)
    plan = make_plan([algorithm])
    labels = torch.tensor([0, 2, 1, 3])
    logits = torch.zeros(4, 4)
    pairing = mixup_params(R.key(3), 4, alpha=1.0)
    results = []
    for target in (labels, F.one_hot(labels, 4)):
        batch = (R.uniform(R.key(1), (4, 3)), target)
        ctx = StepCtx(batch, R.key(3), lambda o, b: o.sum(), outputs=logits, scratch={"mixup": pairing})
        _, ctx = plan.hooks[Event.BEFORE_LOSS][0](None, ctx)
        results.append(ctx.batch[1])
    assert results[0].shape == (4, 4) and torch.equal(results[0], results[1])
