"""The functional step: pure, returns new BatchNorm statistics, and the compiled step equals the eager one."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.algorithms import LabelSmoothing, MixUp
from composer_fn.algorithms.channels_last import channels_last_tensors
from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm
from composer_fn.core.engine import make_plan, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static, StepCtx, initial_state
from composer_fn.core.time import Timestamp
from composer_fn.optim import adamw, sgd
from composer_fn.testing import make_setup
from composer_fn.trainer.step import compile_step, cross_entropy_loss, make_train_step


@dataclass(frozen=True)
class RecordDraws(Algorithm):
    """Copies MixUp's permutation and the mixed input into its own state, so tests can compare draws."""

    algorithm_name = "record_draws"

    def init(self, static, state):
        return {"indices": torch.zeros(8, dtype=torch.int64), "input": torch.zeros(8, 3, 8, 8)}

    def traced_hooks(self, plan_key=()):
        return {Event.BEFORE_LOSS: self._record}

    def _record(self, state: State, ctx: StepCtx):
        record = {"indices": ctx.scratch["mixup"].indices, "input": ctx.batch[0].detach()}
        return state.with_algo(self.name, record), ctx


def _one_step(algorithms, compile_backend=None):
    setup = make_setup(algorithms, seed=11, steps=1)
    plan = make_plan(setup.algorithms, timestamp=Timestamp())
    static, state = run_host_event(Event.BATCH_START, plan, setup.static, setup.state, Timestamp(), BatchMeta(8))
    step = make_train_step(
        static, plan, cross_entropy_loss(), sgd(0.05, momentum=0.9), grad_mode="func" if compile_backend else "autograd"
    )
    if compile_backend:
        step = compile_step(step, compile_backend)
    return state, step(state, setup.batches[0])


@pytest.mark.slow
def test_inductor_step_equals_eager_step_and_keyed_draws_are_bitwise_equal() -> None:
    algorithms = [MixUp(alpha=0.5), LabelSmoothing(0.1), RecordDraws()]
    _, (eager, eager_metrics) = _one_step(algorithms)
    _, (compiled, compiled_metrics) = _one_step(algorithms, compile_backend="inductor")
    assert torch.equal(eager.algos["record_draws"]["indices"], compiled.algos["record_draws"]["indices"])
    torch.testing.assert_close(compiled_metrics["loss"], eager_metrics["loss"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        compiled.algos["record_draws"]["input"], eager.algos["record_draws"]["input"], rtol=1e-6, atol=1e-6
    )
    for name in eager.params:
        torch.testing.assert_close(compiled.params[name], eager.params[name], rtol=1e-6, atol=1e-6)
    for name in eager.buffers:
        torch.testing.assert_close(compiled.buffers[name], eager.buffers[name], rtol=1e-6, atol=1e-6)
    assert torch.equal(compiled.step, eager.step)


def test_autograd_and_func_gradients_give_the_same_step() -> None:
    setup = make_setup([MixUp(alpha=0.5), LabelSmoothing()], seed=2, steps=1)
    plan = make_plan(setup.algorithms)
    _, state = run_host_event(Event.BATCH_START, plan, setup.static, setup.state, Timestamp(), BatchMeta(8))
    results = [
        make_train_step(setup.static, plan, cross_entropy_loss(), sgd(0.05), grad_mode=mode)(state, setup.batches[0])
        for mode in ("autograd", "func")
    ]
    for name in state.params:
        torch.testing.assert_close(results[0][0].params[name], results[1][0].params[name], rtol=1e-6, atol=1e-7)


def test_a_step_without_algorithms_is_the_same_in_both_gradient_modes() -> None:
    setup = make_setup([], seed=4, steps=1)
    plan = make_plan(())
    results = [
        make_train_step(setup.static, plan, cross_entropy_loss(), sgd(0.05, momentum=0.9), grad_mode=mode)(
            setup.state, setup.batches[0]
        )
        for mode in ("autograd", "func")
    ]
    torch.testing.assert_close(results[0][1]["loss"], results[1][1]["loss"], rtol=0, atol=0)
    for field in ("params", "buffers"):
        for name, tensor in getattr(results[0][0], field).items():
            torch.testing.assert_close(tensor, getattr(results[1][0], field)[name], rtol=1e-6, atol=1e-7)


def test_batchnorm_statistics_come_back_as_new_buffers_and_the_input_state_is_untouched() -> None:
    setup = make_setup([], steps=1)
    before = {n: b.clone() for n, b in setup.state.buffers.items()}
    state, _ = make_train_step(setup.static, make_plan(()), cross_entropy_loss(), sgd(0.1))(
        setup.state, setup.batches[0]
    )
    means = [n for n in before if n.endswith("running_mean")]
    assert means and all(not torch.equal(state.buffers[n], before[n]) for n in means)
    for name, buffer in setup.state.buffers.items():
        assert torch.equal(buffer, before[name])
        assert state.buffers[name] is not buffer
    assert int(state.step) == 1 and int(setup.state.step) == 0


def test_an_unknown_gradient_mode_is_rejected() -> None:
    setup = make_setup([], steps=1)
    with pytest.raises(ValueError, match="grad_mode='jax'"):
        make_train_step(setup.static, make_plan(()), cross_entropy_loss(), sgd(0.1), grad_mode="jax")


class PermutedConvolution(nn.Module):
    """A strided convolution whose input went through a permute, as after ConvNeXt's ``LayerNorm2d``: the
    backward returns its weight's gradient in channels-last strides, its weight being contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 2, stride=2)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        return self.head(self.conv(x).flatten(1))


def _contiguous_sum(tensors: Sequence[Tensor]) -> list[Tensor]:
    # The sum over one process, returned as all_reduce_sum returns it: views of one contiguous flat tensor.
    flat = torch.cat([t.reshape(-1) for t in tensors])
    return [piece.view(t.shape) for piece, t in zip(flat.split([t.numel() for t in tensors]), tensors, strict=True)]


STEP_VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "reference": {"norms": True},
    "func": {"grad_mode": "func"},
    "microbatched": {"microbatch_size": 2},
    "summed across processes": {"microbatch_size": 2, "reduce": _contiguous_sum},
    "compiled": {"grad_mode": "func"},
}
OPTIMIZER_PAIRS = {
    "sgd": (lambda: sgd(0.1, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
    "adamw": (lambda: adamw(0.01), lambda ps: torch.optim.AdamW(ps, lr=0.01)),
}


@pytest.mark.parametrize("optimizer", list(OPTIMIZER_PAIRS))
@pytest.mark.parametrize("variant", list(STEP_VARIANTS))
def test_every_step_keeps_a_one_channel_convolutions_channels_last_strides(variant: str, optimizer: str) -> None:
    # A weight of one input channel is contiguous and channels-last by is_contiguous; only its strides make its
    # convolution run the channels-last kernels, and an out-of-place sum would give it contiguous strides.
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    generator = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(4, 1, 8, 8, generator=generator), torch.randint(0, 10, (4,), generator=generator)) for _ in range(2)
    ]
    tx = OPTIMIZER_PAIRS[optimizer][0]()
    state = initial_state(model, R.key(0))
    state = state.replace(params=channels_last_tensors(state.params))
    state = state.replace(opt=tx.init(state.params))
    expected = torch.empty(4, 1, 3, 3, memory_format=torch.channels_last).stride()
    assert state.params["0.weight"].stride() == expected != torch.empty(4, 1, 3, 3).stride()
    step = make_train_step(Static(module=model), make_plan(()), cross_entropy_loss(), tx, **STEP_VARIANTS[variant])
    if variant == "compiled":
        step = compile_step(step, "aot_eager")
    for batch in batches:
        state, _ = step(state, batch)
    assert state.params["0.weight"].stride() == expected


@pytest.mark.parametrize("weights", ["contiguous", "channels_last"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZER_PAIRS))
@pytest.mark.parametrize("variant", list(STEP_VARIANTS))
def test_every_step_updates_a_convolution_after_a_permute_as_torch_optim_does(
    variant: str, optimizer: str, weights: str
) -> None:
    # The weight's gradient comes back from the backward channels-last; a sum across processes returns it
    # contiguous. Either may meet a weight in the other layout.
    ours, theirs = OPTIMIZER_PAIRS[optimizer]
    torch.manual_seed(0)
    model = PermutedConvolution()
    generator = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(4, 8, 8, 8, generator=generator), torch.randint(0, 10, (4,), generator=generator)) for _ in range(2)
    ]
    reference = copy.deepcopy(model)
    steps = theirs(reference.parameters())
    for x, y in batches:
        steps.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        steps.step()
    tx = ours()
    state = initial_state(model, R.key(0))
    if weights == "channels_last":
        state = state.replace(params=channels_last_tensors(state.params))
    state = state.replace(opt=tx.init(state.params))
    step = make_train_step(Static(module=model), make_plan(()), cross_entropy_loss(), tx, **STEP_VARIANTS[variant])
    if variant == "compiled":
        step = compile_step(step, "aot_eager")
    for batch in batches:
        state, _ = step(state, batch)
    initial = {name: p.detach() for name, p in model.named_parameters()}
    for name, expected in reference.named_parameters():
        error = float((state.params[name] - expected.detach()).norm() / (expected.detach() - initial[name]).norm())
        assert error < 1e-5, f"{name}: relative update error {error:.3g}"
