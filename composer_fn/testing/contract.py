"""The algorithm contract suite: checks every algorithm must pass, runnable on your own algorithms too.

Each check builds a small convolutional model on keyed random images, runs the algorithm's host and traced
hooks through real training steps, and raises ``AssertionError`` with a message naming what broke:

- ``check_purity``: no hook writes into its inputs (values, tensor versions and object identities).
- ``check_determinism``: the same seed gives bitwise the same state after several steps.
- ``check_compiled_matches_eager``: the ``torch.compile``d step equals the eager one.
- ``check_checkpoint_round_trip``: the algorithm's state survives a checkpoint file bit for bit.
- ``check_composes``: two algorithms train together for a few steps with a finite loss.

``python -m pytest --pyargs composer_fn.testing`` is not needed: call the checks from your own tests.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm, algorithms_to_json
from composer_fn.core.engine import make_plan, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static
from composer_fn.core.time import Timestamp
from composer_fn.models import SmallCNN
from composer_fn.optim import sgd
from composer_fn.trainer.checkpoint import load_checkpoint, save_checkpoint
from composer_fn.trainer.step import cross_entropy_loss, make_train_step

__all__ = [
    "Setup",
    "make_setup",
    "train_steps",
    "check_purity",
    "check_determinism",
    "check_compiled_matches_eager",
    "check_checkpoint_round_trip",
    "check_composes",
    "CHECKS",
]


@dataclass(frozen=True)
class Setup:
    """A small training set-up for checking algorithms: spec, initial state, keyed batches."""

    algorithms: tuple[Algorithm, ...]
    static: Static
    state: State
    batches: tuple[tuple[Tensor, Tensor], ...]


def make_setup(
    algorithms: Sequence[Algorithm],
    *,
    seed: int = 0,
    batch_size: int = 8,
    image_size: int = 8,
    num_classes: int = 4,
    steps: int = 3,
) -> Setup:
    """Returns a set-up with INIT already run: a width-8 SmallCNN, SGD with momentum, keyed image batches."""
    model = SmallCNN(in_channels=3, num_classes=num_classes, width=8)
    static = Static(module=model, seed=seed)
    state = State(
        params={n: p.detach().clone() for n, p in model.named_parameters()},
        buffers={n: b.detach().clone() for n, b in model.named_buffers()},
        opt=None,
        algos={},
        hparams={},
        step=torch.zeros((), dtype=torch.int64),
        key=R.key(seed),
    )
    algorithms = tuple(algorithms)
    plan = make_plan(algorithms, timestamp=Timestamp())
    static, state = run_host_event(Event.INIT, plan, static, state, Timestamp())
    state = state.replace(
        opt=_optimizer().init(state.params), algos={a.name: a.init(static, state) for a in algorithms}
    )
    data_key = R.fold_in(R.key(seed), 0xDA7A)
    batches = tuple(
        (
            R.normal(R.fold_in(data_key, 2 * i), (batch_size, 3, image_size, image_size)),
            R.randint(R.fold_in(data_key, 2 * i + 1), 0, num_classes, (batch_size,)),
        )
        for i in range(steps)
    )
    return Setup(algorithms, static, state, batches)


def _optimizer() -> Any:
    return sgd(0.05, momentum=0.9)


def train_steps(
    setup: Setup, *, compile_backend: str | None = None, check_inputs: bool = False
) -> tuple[State, list[Tensor]]:
    """Returns the state after training on every batch of ``setup``, and the losses.

    Runs the host events of each batch (BATCH_START before the step, BATCH_END after it) and the traced
    step, as the trainer does. With ``check_inputs``, every host event and step is checked not to have
    written into the state and batch it was given.
    """
    state, static, timestamp = setup.state, setup.static, Timestamp()
    tx, loss_fn = _optimizer(), cross_entropy_loss()
    steps: dict[Any, Callable[[State, Any], tuple[State, dict[str, Tensor]]]] = {}
    losses = []
    names = ", ".join(a.name for a in setup.algorithms)
    for index, batch in enumerate(setup.batches):
        plan = make_plan(setup.algorithms, timestamp=timestamp)
        meta = BatchMeta(batch[0].shape[0])
        guard = _snapshot((state, batch)) if check_inputs else None
        before = state
        static, state = run_host_event(Event.BATCH_START, plan, static, state, timestamp, meta)
        if guard is not None:
            _assert_unchanged((before, batch), guard, f"{names}: BATCH_START hooks of step {index}")
        step = steps.get(plan.step_key)
        if step is None:
            step = make_train_step(static, plan, loss_fn, tx, grad_mode="func" if compile_backend else "autograd")
            if compile_backend:
                step = torch.compile(step, backend=compile_backend, fullgraph=True, dynamic=False)
            steps[plan.step_key] = step
        guard = _snapshot((state, batch)) if check_inputs else None
        before = state
        state, metrics = step(state, batch)
        if guard is not None:
            _assert_unchanged((before, batch), guard, f"{names}: traced step {index}")
            assert state is not before, f"{names}: step {index} returned its input state"
        losses.append(metrics["loss"])
        timestamp = timestamp.advance(meta.batch_size)
        guard = _snapshot(state) if check_inputs else None
        before = state
        after_plan = make_plan(setup.algorithms, timestamp=timestamp)
        static, state = run_host_event(Event.BATCH_END, after_plan, static, state, timestamp)
        if guard is not None:
            _assert_unchanged(before, guard, f"{names}: BATCH_END hooks of step {index}")
    return state, losses


def _snapshot(tree: Any) -> list[tuple[int, Tensor, int]]:
    return [(id(t), t.clone(), t._version) for t in pytree.tree_leaves(tree) if isinstance(t, Tensor)]


def _assert_unchanged(tree: Any, snapshot: list[tuple[int, Tensor, int]], what: str) -> None:
    leaves = [t for t in pytree.tree_leaves(tree) if isinstance(t, Tensor)]
    assert len(leaves) == len(snapshot), f"{what}: the number of tensors changed"
    for index, (tensor, (identity, copy, version)) in enumerate(zip(leaves, snapshot, strict=True)):
        assert id(tensor) == identity, f"{what}: tensor {index} was replaced inside the input"
        assert tensor._version == version, f"{what}: tensor {index} was written in place"
        assert torch.equal(tensor, copy), f"{what}: tensor {index} changed value"


def _assert_states_equal(left: State, right: State, what: str) -> None:
    left_leaves, left_spec = pytree.tree_flatten(left)
    right_leaves, right_spec = pytree.tree_flatten(right)
    assert left_spec == right_spec, f"{what}: the state structure differs"
    for index, (a, b) in enumerate(zip(left_leaves, right_leaves, strict=True)):
        assert torch.equal(a, b), f"{what}: state leaf {index} differs"


def check_purity(algorithm: Algorithm, *, seed: int = 0) -> None:
    """Raises AssertionError if a hook of ``algorithm`` writes into the state or batch it was given."""
    setup = make_setup([algorithm], seed=seed)
    initial = _snapshot((setup.state, setup.batches))
    train_steps(setup, check_inputs=True)
    _assert_unchanged((setup.state, setup.batches), initial, f"{algorithm.name}: the set-up's state and batches")


def check_determinism(algorithm: Algorithm, *, seed: int = 0) -> None:
    """Raises AssertionError unless two runs from the same seed end in bitwise equal states."""
    first, _ = train_steps(make_setup([algorithm], seed=seed))
    second, _ = train_steps(make_setup([algorithm], seed=seed))
    _assert_states_equal(first, second, f"{algorithm.name}: two runs from seed {seed}")


def check_compiled_matches_eager(algorithm: Algorithm, *, seed: int = 0, backend: str = "aot_eager") -> None:
    """Raises AssertionError unless the compiled steps give the eager losses and parameters (within 1e-6)."""
    eager, eager_losses = train_steps(make_setup([algorithm], seed=seed))
    compiled, compiled_losses = train_steps(make_setup([algorithm], seed=seed), compile_backend=backend)
    for step, (a, b) in enumerate(zip(eager_losses, compiled_losses, strict=True)):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-6), f"{algorithm.name}: loss {step} eager {a} compiled {b}"
    for name in eager.params:
        assert torch.allclose(eager.params[name], compiled.params[name], atol=1e-6, rtol=1e-5), (
            f"{algorithm.name}: parameter {name!r} differs between eager and compiled steps"
        )


def check_checkpoint_round_trip(algorithm: Algorithm, *, seed: int = 0) -> None:
    """Raises AssertionError unless a checkpoint written after training loads back bit for bit."""
    setup = make_setup([algorithm], seed=seed)
    trained, _ = train_steps(setup)
    with tempfile.TemporaryDirectory() as folder:
        path = save_checkpoint(Path(folder) / "state.pt", trained, Timestamp(batch=3), algorithms_to_json([algorithm]))
        loaded = load_checkpoint(path, setup.state)
    _assert_states_equal(trained, loaded.state, f"{algorithm.name}: checkpoint round trip")
    assert loaded.algorithms == algorithms_to_json([algorithm]), f"{algorithm.name}: config not restored"


def check_composes(first: Algorithm, second: Algorithm, *, seed: int = 0) -> None:
    """Raises AssertionError unless the two algorithms train together with finite losses."""
    _, losses = train_steps(make_setup([first, second], seed=seed))
    for step, loss in enumerate(losses):
        assert torch.isfinite(loss), f"{first.name} + {second.name}: loss {step} is {float(loss)}"


CHECKS: tuple[Callable[..., None], ...] = (
    check_purity,
    check_determinism,
    check_compiled_matches_eager,
    check_checkpoint_round_trip,
)
"""The single-algorithm checks, in the order the suite runs them."""
