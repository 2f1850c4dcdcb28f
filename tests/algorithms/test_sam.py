"""SAM: a SAM step is Composer's two-pass step, on every interval-th step, in any precision, pure and resumable."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from composer_fn.algorithms import SAM, MixUp
from composer_fn.algorithms.sam import is_sam_step, sam_gradients, sam_perturbation
from composer_fn.core.algorithm import Algorithm, algorithms_to_json
from composer_fn.core.engine import make_plan
from composer_fn.core.event import Event
from composer_fn.core.state import State, StepCtx
from composer_fn.core.time import Timestamp
from composer_fn.optim import sgd
from composer_fn.testing import make_setup
from composer_fn.trainer.checkpoint import load_checkpoint, save_checkpoint
from composer_fn.trainer.step import compile_step, cross_entropy_loss, make_train_step

LEARNING_RATE = 0.1


def _step(algorithms, static, timestamp=None, grad_mode="autograd", backend=None, optimizer=None):
    plan = make_plan(algorithms, timestamp=timestamp or Timestamp())
    step = make_train_step(
        static, plan, cross_entropy_loss(), optimizer or sgd(LEARNING_RATE), grad_mode=grad_mode
    )
    return compile_step(step, backend) if backend else step


def _reference_sam_step(setup, rho, epsilon):
    """Composer's SAMOptimizer step written out on an nn.Module: first_step, second closure, second_step."""
    model = copy.deepcopy(setup.static.module).train()
    model.load_state_dict({**setup.state.params, **setup.state.buffers})
    input, target = setup.batches[0]
    params = dict(model.named_parameters())
    loss = F.cross_entropy(model(input), target)
    grads = torch.autograd.grad(loss, tuple(params.values()))
    norm = torch.norm(torch.stack([g.norm(p=2) for g in grads]), p=2)
    with torch.no_grad():
        perturbations = [g * (rho / (norm + epsilon)) for g in grads]
        for p, e in zip(params.values(), perturbations, strict=True):
            p.add_(e)
    second = torch.autograd.grad(F.cross_entropy(model(input), target), tuple(params.values()))
    with torch.no_grad():
        for p, e, g in zip(params.values(), perturbations, second, strict=True):
            p.sub_(e)
            p.sub_(LEARNING_RATE * g)
    return loss.detach(), {name: p.detach() for name, p in params.items()}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_sam_step_equals_composers_two_pass_step_on_a_module(compiled: bool) -> None:
    setup = make_setup([SAM(rho=0.5)], seed=3, steps=1)
    reference_loss, reference_params = _reference_sam_step(setup, rho=0.5, epsilon=1e-12)
    step = _step(
        setup.algorithms,
        setup.static,
        grad_mode="func" if compiled else "autograd",
        backend="aot_eager" if compiled else None,
    )
    state, metrics = step(setup.state, setup.batches[0])
    torch.testing.assert_close(metrics["loss"], reference_loss, rtol=1e-6, atol=1e-6)
    for name, param in reference_params.items():
        torch.testing.assert_close(state.params[name], param, rtol=1e-6, atol=1e-6)


def test_a_sam_step_moves_the_parameters_differently_from_a_plain_step() -> None:
    setup = make_setup([SAM(rho=0.5)], seed=3, steps=1)
    with_sam, sam_metrics = _step(setup.algorithms, setup.static)(setup.state, setup.batches[0])
    plain, plain_metrics = _step((), setup.static)(setup.state, setup.batches[0])
    assert torch.equal(sam_metrics["loss"], plain_metrics["loss"]), "a SAM step reports the first pass's loss"
    assert any(not torch.equal(with_sam.params[n], plain.params[n]) for n in plain.params)


def test_only_every_interval_th_step_is_a_sam_step() -> None:
    sam = SAM(interval=3)
    assert [b for b in range(7) if sam.match(Event.AFTER_BACKWARD, Timestamp(batch=b))] == [2, 5]
    assert all(is_sam_step(b) for b in range(4))
    setup = make_setup([sam], seed=1, steps=3)
    with_sam, plain = setup.state, setup.state
    for index, batch in enumerate(setup.batches):
        timestamp = Timestamp(batch=index)
        before = with_sam
        with_sam, _ = _step(setup.algorithms, setup.static, timestamp, optimizer=sgd(0.05, momentum=0.9))(
            with_sam, batch
        )
        plain, _ = _step((), setup.static, timestamp, optimizer=sgd(0.05, momentum=0.9))(plain, batch)
        same = all(torch.equal(with_sam.params[n], plain.params[n]) for n in plain.params)
        assert same == (index < 2), f"step {index}: SAM {'did not run' if same else 'ran'}"
        assert before is not with_sam


def test_bf16_autocast_gives_a_finite_loss_close_to_fp32() -> None:
    setup = make_setup([SAM()], seed=5, steps=1)
    full, full_metrics = _step(setup.algorithms, setup.static)(setup.state, setup.batches[0])
    half_static = setup.static.replace(precision="bf16-mixed")
    half, half_metrics = _step(setup.algorithms, half_static)(setup.state, setup.batches[0])
    assert torch.isfinite(half_metrics["loss"])
    torch.testing.assert_close(half_metrics["loss"], full_metrics["loss"], rtol=0.05, atol=0.05)
    for name in full.params:
        assert half.params[name].dtype == torch.float32
        torch.testing.assert_close(half.params[name], full.params[name], rtol=0.05, atol=0.02)


def test_batchnorm_statistics_advance_once_per_step_by_the_first_pass() -> None:
    setup = make_setup([SAM(rho=1.0)], seed=2, steps=1)
    with_sam, _ = _step(setup.algorithms, setup.static)(setup.state, setup.batches[0])
    plain, _ = _step((), setup.static)(setup.state, setup.batches[0])
    tracked = [n for n in plain.buffers if n.endswith("num_batches_tracked")]
    assert tracked and all(int(with_sam.buffers[n]) == 1 for n in tracked)
    for name, buffer in plain.buffers.items():
        assert torch.equal(with_sam.buffers[name], buffer), f"buffer {name!r} is not the first pass's"


@dataclass(frozen=True)
class RecordClosure(Algorithm):
    """Calls the loss closure at the step's own parameters and keeps what it returned, and the step's own."""

    algorithm_name = "record_closure"
    requires = frozenset({"loss_closure"})

    def traced_hooks(self, plan_key=()):
        return {Event.AFTER_BACKWARD: self._record}

    def _record(self, state: State, ctx: StepCtx):
        assert ctx.gradient_fn is not None and ctx.grads is not None and ctx.loss is not None
        with torch.no_grad():
            loss, grads = ctx.gradient_fn(state.params)
        record = {"loss": loss, "grads": grads, "step_loss": ctx.loss, "step_grads": dict(ctx.grads)}
        return state.replace(algos={**state.algos, self.name: record}), ctx


@pytest.mark.parametrize("grad_mode", ["autograd", "func"])
def test_the_closure_recomputes_the_batch_as_the_loss_saw_it_and_writes_nothing(grad_mode: str) -> None:
    setup = make_setup([MixUp(alpha=0.5), RecordClosure()], seed=7, steps=1)
    state = setup.state.replace(algos={**setup.state.algos, "record_closure": None})
    snapshot = [(t, t.clone(), t._version) for t in pytree.tree_leaves((state, setup.batches[0]))]
    after, _ = _step(setup.algorithms, setup.static, grad_mode=grad_mode)(state, setup.batches[0])
    for tensor, value, version in snapshot:
        assert tensor._version == version and torch.equal(tensor, value)
    record = after.algos["record_closure"]
    torch.testing.assert_close(record["loss"], record["step_loss"], rtol=1e-6, atol=1e-7)
    for name, grad in record["step_grads"].items():
        torch.testing.assert_close(record["grads"][name], grad, rtol=1e-5, atol=1e-7)


def test_the_perturbation_has_norm_rho_and_the_functions_write_nothing() -> None:
    grads = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([[4.0]])}
    perturbation = sam_perturbation(grads, rho=0.5)
    norm = torch.linalg.vector_norm(torch.cat([e.flatten() for e in perturbation.values()]))
    torch.testing.assert_close(norm, torch.tensor(0.5))
    torch.testing.assert_close(perturbation["a"], torch.tensor([0.3, 0.0]))
    params = {"a": torch.ones(2), "b": torch.ones(1, 1)}
    seen = {}

    def gradient_fn(at):
        seen.update(at)
        return torch.tensor(0.0), {n: torch.zeros_like(p) for n, p in at.items()}

    sam_gradients(params, grads, gradient_fn, rho=0.5)
    torch.testing.assert_close(seen["b"], torch.tensor([[1.4]]))
    assert torch.equal(params["a"], torch.ones(2)) and torch.equal(grads["a"], torch.tensor([3.0, 0.0]))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [({"rho": -0.1}, "rho=-0.1"), ({"epsilon": 0.0}, "epsilon=0.0"), ({"interval": 0}, "interval=0")],
)
def test_bad_hyperparameters_are_refused_by_name(arguments, message) -> None:
    with pytest.raises(ValueError, match=message):
        SAM(**arguments)


def _run(setup, state, start, stop):
    for index in range(start, stop):
        state, _ = _step(setup.algorithms, setup.static, Timestamp(batch=index), optimizer=sgd(0.05, momentum=0.9))(
            state, setup.batches[index]
        )
    return state


def test_resuming_from_a_mid_run_checkpoint_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    algorithms = [SAM(rho=0.2, interval=2)]
    setup = make_setup(algorithms, seed=9, steps=5)
    uninterrupted = _run(setup, setup.state, 0, 5)
    middle = _run(setup, setup.state, 0, 3)
    path = save_checkpoint(tmp_path / "ba3.pt", middle, Timestamp(batch=3), algorithms_to_json(algorithms))
    loaded = load_checkpoint(path, setup.state, algorithms=algorithms_to_json(algorithms))
    assert loaded.timestamp.batch == 3
    resumed = _run(setup, loaded.state, loaded.timestamp.batch, 5)
    finished, spec = pytree.tree_flatten(uninterrupted)
    again, spec_again = pytree.tree_flatten(resumed)
    assert spec == spec_again
    assert all(torch.equal(a, b) for a, b in zip(finished, again, strict=True))
