"""ALiBi: Press et al.'s slopes, the bias formula, a pure and idempotent surgery, token-keeping shorter rows."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from composer_fn import optim
from composer_fn.algorithms.alibi import (
    Alibi,
    AlibiBias,
    alibi_slopes,
    apply_alibi,
    scale_batch_sequence_length,
    scaled_sequence_length,
)
from composer_fn.core import random as R
from composer_fn.core.algorithm import algorithm_from_config
from composer_fn.core.engine import make_plan, run_event
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, StepCtx
from composer_fn.core.time import Timestamp
from composer_fn.data import TensorLoader
from composer_fn.models.bert import MaskedLM, mask_tokens, masked_lm_loss
from composer_fn.models.lm import CausalLM, causal_lm_loss
from composer_fn.nn import init_parameters
from composer_fn.testing.settings import settings_for
from composer_fn.trainer import Trainer

seeds = st.integers(0, 2**31 - 1)


def _composer_slopes(num_heads: int) -> list[float]:
    # Composer's get_alibi_head_slopes, written out: start = 2^(-2^-(log2 n - 3)), slope_h = start^(h + 1).
    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**head for head in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + _composer_slopes(2 * closest)[0::2][: num_heads - closest]


def _model(
    seed: int, *, heads: int = 2, layers: int = 2, length: int = 16, masked: bool = False
) -> nn.Module:
    model: nn.Module
    if masked:
        model = MaskedLM(17, d_model=4 * heads, n_heads=heads, n_layers=layers, max_seq_len=length)
    else:
        model = CausalLM(17, d_model=4 * heads, n_heads=heads, n_layers=layers, max_seq_len=length)
    model.load_state_dict(init_parameters(model, R.key(seed)), strict=False)
    return model


def _structure(model: nn.Module) -> list[tuple[str, str]]:
    return [(name, type(module).__name__) for name, module in model.named_modules()]


def _tensors(model: nn.Module) -> dict[str, Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@pytest.mark.parametrize("num_heads", range(1, 65))
def test_the_slopes_are_composers_for_every_head_count(num_heads: int) -> None:
    assert alibi_slopes(num_heads) == pytest.approx(_composer_slopes(num_heads), rel=1e-12)


def test_a_power_of_two_gives_the_geometric_sequence_of_the_paper() -> None:
    assert alibi_slopes(8) == [2.0**-k for k in range(1, 9)]
    assert alibi_slopes(16) == pytest.approx([2.0 ** (-0.5 * k) for k in range(1, 17)], rel=1e-12)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 12), st.integers(1, 20), st.integers(1, 3))
def test_the_bias_is_minus_slope_times_distance(num_heads: int, length: int, batch: int) -> None:
    query = torch.zeros(batch, num_heads, length, 4)
    bias = AlibiBias(num_heads)(query, query)
    slopes = alibi_slopes(num_heads)
    expected = torch.tensor(
        [[[-slopes[h] * abs(i - j) for j in range(length)] for i in range(length)] for h in range(num_heads)]
    )
    assert bias.shape == (num_heads, length, length)
    torch.testing.assert_close(bias, expected, rtol=1e-6, atol=0)


class _ComposerCausalBias(nn.Module):
    """Composer's causal form of the bias, ``slope_h * j``, for comparison."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.slopes = torch.tensor(alibi_slopes(num_heads))

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        return self.slopes[:, None, None] * torch.arange(key.shape[-2], dtype=torch.float32)[None, None, :]


@settings(max_examples=10, deadline=None)
@given(seeds, st.sampled_from([1, 2, 3, 4]), st.integers(1, 16))
def test_on_a_causal_model_the_symmetric_bias_attends_as_composers_causal_form(
    seed: int, heads: int, length: int
) -> None:
    model = apply_alibi(_model(seed, heads=heads), 16)
    tokens = R.randint(R.key(seed), 0, 17, (2, length))
    with torch.no_grad():
        ours = model(tokens)
        for block in model.blocks:
            block.attention.position_bias = _ComposerCausalBias(heads)
        composers = model(tokens)
    torch.testing.assert_close(ours, composers, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_the_surgery_removes_the_position_embedding_and_biases_every_attention(masked: bool) -> None:
    model = _model(0, heads=3, layers=3, masked=masked)
    assert Alibi().targets(model) == {"position_embedding"} | {
        f"blocks.{i}.attention.position_bias" for i in range(3)
    }
    rewritten = apply_alibi(model, 40)
    assert rewritten.position_embedding is None and rewritten.max_seq_len == 40
    for block in rewritten.blocks:
        bias = block.attention.position_bias
        assert isinstance(bias, AlibiBias) and bias.num_heads == 3
    assert "position_embedding.weight" not in dict(rewritten.named_parameters())
    # Every kept tensor keeps its value.
    kept = dict(rewritten.named_parameters())
    assert all(torch.equal(kept[n], p) for n, p in model.named_parameters() if n in kept)
    # No position-shaped tensor is left: longer rows than the model was built for are accepted.
    assert rewritten(R.randint(R.key(1), 0, 17, (1, 40))).shape == (1, 40, 17)


@settings(max_examples=10, deadline=None)
@given(seeds, st.booleans())
def test_the_surgery_leaves_its_input_untouched(seed: int, masked: bool) -> None:
    model = _model(seed, masked=masked)
    structure = _structure(model)
    before = {name: (tensor.clone(), tensor._version, id(tensor)) for name, tensor in _tensors(model).items()}
    rewritten = apply_alibi(model, 32)
    assert _structure(model) == structure and model.max_seq_len == 16
    for name, tensor in _tensors(model).items():
        value, version, identity = before[name]
        assert torch.equal(tensor, value) and tensor._version == version and id(tensor) == identity
    shared = {id(t) for t in _tensors(model).values()} & {id(t) for t in _tensors(rewritten).values()}
    assert not shared


@settings(max_examples=10, deadline=None)
@given(seeds, st.booleans())
def test_applying_twice_equals_applying_once(seed: int, masked: bool) -> None:
    once = apply_alibi(_model(seed, masked=masked), 32)
    twice = apply_alibi(once, 32)
    assert Alibi().targets(once) == frozenset()
    assert _structure(twice) == _structure(once)
    assert all(torch.equal(twice_tensor, _tensors(once)[n]) for n, twice_tensor in _tensors(twice).items())
    tokens = R.randint(R.key(seed), 0, 17, (2, 12))
    with torch.no_grad():
        assert torch.equal(twice(tokens), once(tokens))


@settings(max_examples=10, deadline=None)
@given(seeds, st.integers(1, 11))
def test_the_causal_model_stays_causal_and_the_masked_one_bidirectional(seed: int, position: int) -> None:
    tokens = R.randint(R.key(seed), 0, 17, (2, 12))
    changed = tokens.clone()
    changed[:, position] = (tokens[:, position] + 1) % 17
    causal, masked = apply_alibi(_model(seed), 32), apply_alibi(_model(seed, masked=True), 32)
    with torch.no_grad():
        torch.testing.assert_close(
            causal(changed)[:, :position], causal(tokens)[:, :position], rtol=0, atol=1e-6
        )
        earlier = (masked(changed)[:, :position] - masked(tokens)[:, :position]).abs().amax(dim=-1)
    assert (earlier > 1e-6).all()


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 5), st.integers(1, 8), st.sampled_from([0.25, 0.5, 1.0]), seeds)
def test_the_batch_reshape_keeps_every_token_and_each_label_with_its_input(
    batch: int, quarters: int, scaling: float, seed: int
) -> None:
    length = 4 * quarters
    inputs = R.randint(R.key(seed), 0, 100, (batch, length))
    labels = inputs + 1000
    reshaped = scale_batch_sequence_length((inputs, labels), scaling)
    rows = int(length * scaling)
    assert reshaped[0].shape == reshaped[1].shape == (batch * length // rows, rows)
    assert reshaped[0].numel() == inputs.numel()
    assert torch.equal(reshaped[0].flatten(), inputs.flatten()) and torch.equal(
        reshaped[1] - 1000, reshaped[0]
    )
    mapping = scale_batch_sequence_length({"input_ids": inputs, "labels": labels}, scaling)
    assert torch.equal(mapping["labels"], reshaped[1])


def test_a_scaling_that_would_drop_tokens_is_refused_naming_the_argument() -> None:
    assert scaled_sequence_length(8, 128, 0.25) == 32
    with pytest.raises(ValueError, match="train_sequence_length_scaling=0.25.*7 tokens"):
        scaled_sequence_length(2, 30, 0.25)
    with pytest.raises(ValueError, match="train_sequence_length_scaling=0.1"):
        scaled_sequence_length(1, 5, 0.1)
    for bad in (0.0, 1.5, -0.25, True, "0.25"):
        with pytest.raises(ValueError, match="train_sequence_length_scaling"):
            Alibi(train_sequence_length_scaling=bad)  # type: ignore[arg-type]
    for bad_length in (0, 2.0, True):
        with pytest.raises(ValueError, match="max_sequence_length"):
            Alibi(max_sequence_length=bad_length)  # type: ignore[arg-type]


def test_the_traced_hook_reshapes_to_the_plan_key_length() -> None:
    algorithm = Alibi(max_sequence_length=64, train_sequence_length_scaling=0.25)
    inputs = R.randint(R.key(0), 0, 17, (4, 32))
    batch = (inputs, inputs + 1)
    meta = BatchMeta(4, (4, 32))
    assert algorithm.plan_key(Timestamp(), meta) == 8 and algorithm.plan_key(Timestamp()) is None
    state = State(
        params={},
        buffers={},
        opt=None,
        algos={},
        hparams={},
        step=torch.zeros((), dtype=torch.int64),
        key=R.key(0),
    )
    for plan in (make_plan([algorithm], meta=meta), make_plan([algorithm])):
        ctx = StepCtx(batch=batch, key=R.key(0), loss_fn=lambda outputs, batch: outputs)
        _, ctx = run_event(Event.AFTER_DATALOADER, plan, state, ctx)
        assert ctx.batch[0].shape == (16, 8) and torch.equal(ctx.batch[1], ctx.batch[0] + 1)
    with pytest.raises(TypeError, match="plan_key"):
        algorithm.traced_hooks("8")


class _NoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)


def test_a_model_without_blocks_is_returned_unchanged_with_a_warning() -> None:
    model = _NoBlocks()
    with pytest.warns(UserWarning, match="Alibi found no transformer blocks"):
        rewritten = apply_alibi(model, 16)
    assert rewritten is not model and repr(rewritten) == repr(model)
    assert Alibi().targets(model) == frozenset()


def test_blocks_off_the_protocol_are_refused_naming_the_missing_attribute() -> None:
    model = _model(0)
    del model.blocks[1].attention.position_bias
    with pytest.raises(TypeError, match=r"model\.blocks\.1\.attention .*'position_bias'"):
        Alibi().targets(model)
    foreign = _model(0)
    foreign.blocks[0].attention.position_bias = _ComposerCausalBias(2)
    with pytest.raises(ValueError, match="already holds a _ComposerCausalBias"):
        apply_alibi(foreign, 16)


def test_the_record_round_trips_through_its_config_and_keeps_composers_defaults() -> None:
    algorithm = Alibi(max_sequence_length=128, train_sequence_length_scaling=0.5)
    assert algorithm_from_config(algorithm.to_config()) == algorithm
    assert (Alibi().max_sequence_length, Alibi().train_sequence_length_scaling) == (8192, 0.25)
    assert not settings_for("alibi").stochastic(Alibi()) and Alibi().capabilities().rewrites is not None


def _causal_loader() -> TensorLoader:
    rows = R.randint(R.key(0), 0, 17, (16, 17))
    return TensorLoader((rows[:, :-1].clone(), rows[:, 1:].clone()), 8, seed=0)


@pytest.mark.usefixtures("fresh_compiler")
def test_the_causal_model_trains_with_finite_losses_eagerly_and_compiled_alike() -> None:
    losses = {}
    for compile in (False, "aot_eager"):
        trainer = Trainer(
            CausalLM(17, d_model=8, n_heads=2, n_layers=1, max_seq_len=16),
            _causal_loader(),
            _causal_loader(),
            max_duration="2ba",
            optimizer=optim.adamw(3e-3),
            algorithms=[Alibi(max_sequence_length=64)],
            loss_fn=causal_lm_loss(),
            compile=compile,
            progress_bar=False,
        )
        metrics = trainer.fit()
        assert trainer.static.module.position_embedding is None
        losses[compile] = (metrics["loss"], metrics["eval/eval/loss"])
    assert all(math.isfinite(value) for pair in losses.values() for value in pair)
    assert losses[False] == pytest.approx(losses["aot_eager"], rel=1e-5)


def test_the_masked_model_trains_with_finite_loss_on_rows_of_the_scaled_length() -> None:
    rows = R.randint(R.key(1), 0, 16, (16, 16))
    inputs, labels = mask_tokens(rows, key=R.key(2), mask_token_id=16, vocab_size=16, mlm_probability=0.3)
    seen: list[tuple[int, ...]] = []
    masked_loss = masked_lm_loss()

    def loss_fn(outputs: Tensor, batch: tuple[Tensor, Tensor]) -> Tensor:
        seen.append(tuple(batch[1].shape))
        return masked_loss(outputs, batch)

    trainer = Trainer(
        MaskedLM(17, d_model=8, n_heads=2, n_layers=1, max_seq_len=16),
        TensorLoader((inputs, labels), 8, seed=0),
        max_duration="2ba",
        optimizer=optim.adamw(3e-3),
        algorithms=[Alibi(max_sequence_length=64, train_sequence_length_scaling=0.5)],
        loss_fn=loss_fn,
        progress_bar=False,
    )
    assert math.isfinite(trainer.fit()["loss"])
    assert seen == [(16, 8), (16, 8)]
    assert all(isinstance(b.attention.position_bias, AlibiBias) for b in trainer.static.module.blocks)


def test_an_image_batch_is_refused_saying_what_its_first_item_is() -> None:
    from composer_fn.functional import scale_batch_sequence_length

    images = (torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"batch of type tuple: its first item is a tensor of shape \(4, 1, 8, 8\); expected"):
        scale_batch_sequence_length(images, 0.5)
