"""The algorithm contract suite: checks every algorithm must pass, runnable on your own algorithms too.

Each check builds a small convolutional model on keyed random images, runs the algorithm's host and traced
hooks through real training steps, and raises ``AssertionError`` with a message naming what broke:

- ``check_purity``: no hook writes into its inputs (values, tensor versions and object identities).
- ``check_determinism``: the same seed gives bitwise the same state after several steps.
- ``check_compiled_matches_eager``: the ``torch.compile``d step equals the eager one.
- ``check_checkpoint_round_trip``: the algorithm's state survives a checkpoint file bit for bit.
- ``check_keys_matter``: other keys give other results if and only if the algorithm declares itself stochastic.
- ``check_dtypes``: the input-side hooks keep uint8/float16/bfloat16/float32 inputs' dtype (or refuse a dtype
  with an error naming it).
- ``check_composes``: two algorithms train together for a few steps with a finite loss.

The run is the trainer's: ``train_steps`` drives ``run_schedule``, running every host event it yields (fit,
epoch and batch events) and the traced step. What each algorithm is checked with (its example
hyperparameters, its kind of batch, its model, whether it is stochastic) comes from
``composer_fn.testing.settings``: image algorithms are checked on a SmallCNN, token algorithms on a small
CausalLM, unless their settings name a model.

Every check but ``check_dtypes`` also takes ``on``: a function returning ``(model, batches)``, a fresh model
of your own and the batches to train it on (tuples read at item 0, or mappings given to the model as keyword
arguments, as the Trainer does; the loss is the Trainer's default: the model's own where it computes one). The
checks then run on it instead: a Hugging Face model and its token batches, a timm or torchvision network and
its images (``composer_fn.testing.models`` builds small ones).

``python -m pytest --pyargs composer_fn.testing`` is not needed: call the checks from your own tests.
"""

from __future__ import annotations

import copy as copying
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn
from torch.func import functional_call

from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm, algorithms_to_json
from composer_fn.core.engine import frozen_parameters, make_plan, run_event, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.schedule import Action, Progress, next_tick, run_schedule
from composer_fn.core.state import (
    ForwardFn,
    LossFn,
    State,
    Static,
    StepCtx,
    batch_input,
    batch_meta,
    initial_state,
)
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.models import SmallCNN
from composer_fn.nn import init_parameters
from composer_fn.optim import sgd
from composer_fn.testing.settings import CheckSettings, modality_of, settings_for
from composer_fn.trainer.checkpoint import load_checkpoint, save_checkpoint
from composer_fn.trainer.outputs import (
    default_loss,
    default_per_sample_loss,
    is_causal_lm,
    keyword_names,
    logits_of,
    model_inputs,
)
from composer_fn.trainer.step import (
    GradMode,
    cross_entropy_loss,
    cross_entropy_per_sample_loss,
    per_sample_loss,
)
from composer_fn.trainer.steps import StepBuilder, StepCache, StepSpec

__all__ = [
    "On",
    "Setup",
    "make_setup",
    "train_steps",
    "check_purity",
    "check_determinism",
    "check_compiled_matches_eager",
    "check_checkpoint_round_trip",
    "check_composes",
    "check_dtypes",
    "check_keys_matter",
    "check_surgery",
    "make_forward",
    "CHECKS",
    "IMAGE_DTYPES",
]


@dataclass(frozen=True)
class Setup:
    """A small training set-up for checking algorithms: spec, initial state, keyed batches, losses."""

    algorithms: tuple[Algorithm, ...]
    static: Static
    state: State
    batches: tuple[Any, ...]
    loss_fn: LossFn
    per_sample_loss_fn: LossFn
    max_duration: Time
    input_key: int | str | None = 0
    """Where the model's input is (None: a mapping batch's items as keyword arguments)."""


On = Callable[[], tuple[nn.Module, Sequence[Any]]]
"""``on()`` returns a fresh model and the batches to check algorithms on it with (see the module docstring)."""


def make_setup(
    algorithms: Sequence[Algorithm],
    *,
    seed: int = 0,
    key_seed: int | None = None,
    batch_size: int = 8,
    image_size: int = 8,
    num_classes: int = 4,
    sequence_length: int = 32,
    steps: int = 3,
    modality: str | None = None,
    model: nn.Module | None = None,
    batches: Sequence[Any] | None = None,
) -> Setup:
    """Returns a set-up with INIT already run, for the algorithms' ``modality``.

    Images: a width-8 SmallCNN (or the first model the algorithms' check settings name) on keyed
    ``[B, 3, image_size, image_size]`` images and ``num_classes`` classes.
    Tokens: a one-block CausalLM over 16 symbols on keyed ``[B, sequence_length]`` token rows with next-token
    labels. Both train with SGD with momentum; the run's ``max_duration`` is ``steps`` batches. ``seed`` draws the
    model and the data; ``key_seed`` (default ``seed``) is the root of the algorithms' random draws.
    ``modality`` overrides the one the algorithms declare (for a set-up without algorithms); ``model`` the model
    (a token model reads ``[B, S]`` ids below 16). With ``batches`` (and ``model``, the model they are for), the
    run trains that model from its own weights on them, one step per batch, with the Trainer's default losses.
    """
    if batches is not None:
        if model is None:
            raise ValueError("make_setup(batches=...) needs model=..., the model the batches are for")
        return _given_setup(algorithms, model, tuple(batches), seed if key_seed is None else key_seed)
    modality = modality or modality_of(algorithms)
    data_key = R.fold_in(R.key(seed), 0xDA7A)
    given = model
    if modality == "tokens":
        from composer_fn.models.lm import CausalLM, causal_lm_loss

        built = CausalLM(16, d_model=16, n_heads=2, n_layers=1, max_seq_len=max(sequence_length, 8))
        model = given if given is not None else built
        init = init_parameters(model, R.key(seed))
        rows = [R.randint(R.fold_in(data_key, i), 0, 16, (batch_size, sequence_length + 1)) for i in range(steps)]
        made: tuple[Any, ...] = tuple((row[:, :-1].clone(), row[:, 1:].clone()) for row in rows)
        loss_fn = causal_lm_loss()
    else:
        build = next((s.model for s in map(settings_for, algorithms) if s.model is not None), None)
        chosen = given or (build() if build is not None else None)
        model = chosen if chosen is not None else SmallCNN(in_channels=3, num_classes=num_classes, width=8)
        init = init_parameters(model, R.key(seed))
        made = tuple(
            (
                R.normal(R.fold_in(data_key, 2 * i), (batch_size, 3, image_size, image_size)),
                R.randint(R.fold_in(data_key, 2 * i + 1), 0, num_classes, (batch_size,)),
            )
            for i in range(steps)
        )
        loss_fn = cross_entropy_loss()
    root = seed if key_seed is None else key_seed
    inputs = tuple(batch[0] for batch in made)
    wants_data = any("train_data" in a.requires for a in algorithms)
    static = Static(module=model, seed=root, train_inputs=(lambda: iter(inputs)) if wants_data else None)
    state = initial_state(model, R.key(root)).replace(params=dict(init))
    algorithms = tuple(algorithms)
    max_duration = Time(steps, TimeUnit.BATCH)
    start = Timestamp().with_max_duration(max_duration)
    plan = make_plan(algorithms, timestamp=start)
    static, state = run_host_event(Event.INIT, plan, static, state, start)
    state = state.replace(
        opt=_optimizer().init(state.params), algos={a.name: a.init(static, state) for a in algorithms}
    )
    per_sample = cross_entropy_per_sample_loss() if modality == "image" else per_sample_loss(loss_fn)
    return Setup(algorithms, static, state, made, loss_fn, per_sample, max_duration)


def _given_setup(algorithms: Sequence[Algorithm], model: nn.Module, batches: tuple[Any, ...], root: int) -> Setup:
    if not batches:
        raise ValueError("make_setup(batches=()) needs at least one batch")
    input_key = None if isinstance(batches[0], Mapping) else 0
    inputs = tuple(batch_input(batch, input_key) for batch in batches)
    wants_data = any("train_data" in a.requires for a in algorithms)
    static = Static(module=model, seed=root, train_inputs=(lambda: iter(inputs)) if wants_data else None)
    state = initial_state(model, R.key(root))
    max_duration = Time(len(batches), TimeUnit.BATCH)
    start = Timestamp().with_max_duration(max_duration)
    static, state = run_host_event(Event.INIT, make_plan(tuple(algorithms), timestamp=start), static, state, start)
    state = state.replace(
        opt=_optimizer().init(state.params), algos={a.name: a.init(static, state) for a in algorithms}
    )
    per_sample = default_per_sample_loss(None, is_causal_lm(model))
    return Setup(tuple(algorithms), static, state, batches, default_loss(None), per_sample, max_duration, input_key)


def _on(on: On | None) -> dict[str, Any]:
    if on is None:
        return {}
    model, batches = on()
    return {"model": model, "batches": batches}


def _optimizer() -> Any:
    return sgd(0.05, momentum=0.9)


def train_steps(
    setup: Setup, *, compile_backend: str | None = None, check_inputs: bool = False
) -> tuple[State, list[Tensor]]:
    """Returns the state after training on every batch of ``setup``, and the losses.

    Drives the trainer's own schedule (``run_schedule``) over one epoch of the run's length: every host event
    it yields runs its hooks, and each step runs the traced step, as in ``Trainer.fit``. With
    ``check_inputs``, every host event and step is checked not to have written into the state and batch it
    was given.
    """
    state, static = setup.state, setup.static
    start = Timestamp().with_max_duration(setup.max_duration)
    ticks = run_schedule(len(setup.batches), int(setup.max_duration.value), start=start)
    steps = StepCache(
        StepBuilder(setup.loss_fn, _optimizer(), input_key=setup.input_key, per_sample_loss_fn=setup.per_sample_loss_fn)
    )
    losses: list[Tensor] = []
    names = ", ".join(a.name for a in setup.algorithms)
    batches = iter(setup.batches)
    batch, meta = None, None
    reply: Progress | None = None
    while (tick := next_tick(ticks, reply)) is not None:
        what, timestamp = tick
        reply = None
        if what is Event.BEFORE_DATALOADER:
            batch = next(batches)
        elif what is Event.BATCH_START:
            meta = batch_meta(batch, setup.input_key)
        elif what is Event.BATCH_END:
            meta = None
        plan = make_plan(setup.algorithms, timestamp=timestamp, meta=meta)
        guard = _snapshot((state, batch)) if check_inputs else None
        before = state
        if isinstance(what, Event):
            static, state = run_host_event(what, plan, static, state, timestamp, meta)
            where = f"{what.name} hooks at batch {timestamp.batch}"
        elif what is Action.STEP:
            assert meta is not None
            frozen = frozen_parameters(setup.algorithms, timestamp, static.module)
            grad_mode: GradMode = "func" if compile_backend else "autograd"
            step = steps.train_step(StepSpec(static, plan.step_key, frozen, grad_mode, compile_backend), plan)
            state, metrics = step(state, batch)
            losses.append(metrics["loss"])
            reply = Progress(meta.batch_size, meta.tokens)
            where = f"traced step {timestamp.batch}"
            assert not check_inputs or state is not before, f"{names}: step {timestamp.batch} returned its input state"
        else:
            continue
        if guard is not None:
            _assert_unchanged((before, batch), guard, f"{names}: {where}")
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


def check_purity(algorithm: Algorithm, *, seed: int = 0, on: On | None = None) -> None:
    """Raises AssertionError if a hook of ``algorithm`` writes into the state or batch it was given."""
    setup = make_setup([algorithm], seed=seed, **_on(on))
    initial = _snapshot((setup.state, setup.batches))
    train_steps(setup, check_inputs=True)
    _assert_unchanged((setup.state, setup.batches), initial, f"{algorithm.name}: the set-up's state and batches")


def check_determinism(algorithm: Algorithm, *, seed: int = 0, on: On | None = None) -> None:
    """Raises AssertionError unless two runs from the same seed end in bitwise equal states."""
    first, _ = train_steps(make_setup([algorithm], seed=seed, **_on(on)))
    second, _ = train_steps(make_setup([algorithm], seed=seed, **_on(on)))
    _assert_states_equal(first, second, f"{algorithm.name}: two runs from seed {seed}")


def check_compiled_matches_eager(
    algorithm: Algorithm, *, seed: int = 0, backend: str = "aot_eager", on: On | None = None
) -> None:
    """Raises AssertionError unless the compiled steps give the eager losses and parameters (within 1e-6)."""
    eager, eager_losses = train_steps(make_setup([algorithm], seed=seed, **_on(on)))
    compiled, compiled_losses = train_steps(make_setup([algorithm], seed=seed, **_on(on)), compile_backend=backend)
    for step, (a, b) in enumerate(zip(eager_losses, compiled_losses, strict=True)):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-6), f"{algorithm.name}: loss {step} eager {a} compiled {b}"
    for name in eager.params:
        assert torch.allclose(eager.params[name], compiled.params[name], atol=1e-6, rtol=1e-5), (
            f"{algorithm.name}: parameter {name!r} differs between eager and compiled steps"
        )


def check_checkpoint_round_trip(algorithm: Algorithm, *, seed: int = 0, on: On | None = None) -> None:
    """Raises AssertionError unless a checkpoint written after training loads back bit for bit."""
    setup = make_setup([algorithm], seed=seed, **_on(on))
    trained, _ = train_steps(setup)
    with tempfile.TemporaryDirectory() as folder:
        path = save_checkpoint(
            Path(folder) / "state.pt", trained, Timestamp(batch=3), algorithms_to_json([algorithm])
        )
        loaded = load_checkpoint(path, setup.state)
    _assert_states_equal(trained, loaded.state, f"{algorithm.name}: checkpoint round trip")
    assert loaded.algorithms == algorithms_to_json([algorithm]), f"{algorithm.name}: config not restored"


def check_keys_matter(
    algorithm: Algorithm, *, seed: int = 0, settings: CheckSettings | None = None, on: On | None = None
) -> None:
    """Raises AssertionError unless other keys give other results exactly when the algorithm is stochastic.

    Model and data stay the same; only the root key changes. A deterministic algorithm (its ``settings`` say
    ``stochastic`` is false; by default the registered settings) must give bitwise the same state under both keys.
    """
    first, _ = train_steps(make_setup([algorithm], seed=seed, key_seed=seed, **_on(on)))
    second, _ = train_steps(make_setup([algorithm], seed=seed, key_seed=seed + 1, **_on(on)))
    same = all(torch.equal(first.params[name], second.params[name]) for name in first.params)
    if (settings or settings_for(algorithm)).stochastic(algorithm):
        assert not same, f"{algorithm.name}: keys {seed} and {seed + 1} gave the same parameters"
    else:
        assert same, f"{algorithm.name}: declared deterministic, yet keys {seed} and {seed + 1} gave different results"


def _module_snapshot(module: nn.Module) -> tuple[str, list[tuple[str, Tensor, int]]]:
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return repr(module), [(name, t.detach().clone(), t._version) for name, t in tensors]


def _outputs(static: Static, state: State, input: Any) -> Any:
    module = static.module
    mode = module.training
    module.eval()
    try:
        with torch.no_grad():
            if isinstance(input, Mapping):
                given = model_inputs(input, None, keyword_names(module))
                return functional_call(module, (dict(state.params), dict(state.buffers)), (), given)
            return functional_call(module, (dict(state.params), dict(state.buffers)), (input,))
    finally:
        module.train(mode)


def check_surgery(
    algorithm: Algorithm, *, seed: int = 0, settings: CheckSettings | None = None, on: On | None = None
) -> None:
    """Raises AssertionError unless a model rewrite is pure and idempotent (algorithms that rewrite nothing pass).

    The rewrite at INIT must claim a submodule of the suite's model (so the check checks something), leave
    the given module, its tensors and the state untouched, claim nothing on its own result, and give, applied
    again, the same structure, tensors and outputs.
    """
    rewrites = algorithm.capabilities().rewrites
    if rewrites is None:
        return
    chosen = settings or settings_for(algorithm)
    model = chosen.model() if chosen.model is not None else None
    given = _on(on)
    plain = make_setup([], seed=seed, modality=chosen.modality, **(given or {"model": model}))
    module = plain.static.module
    assert rewrites(module), f"{algorithm.name}: claims no submodule of the suite's model"
    before = _module_snapshot(module)
    guard = _snapshot(plain.state)
    start = Timestamp().with_max_duration(plain.max_duration)
    plan = make_plan([algorithm], timestamp=start)
    once_static, once = run_host_event(Event.INIT, plan, plain.static, plain.state, start)
    _assert_unchanged(plain.state, guard, f"{algorithm.name}: INIT surgery on its input state")
    after = _module_snapshot(module)
    assert before[0] == after[0], f"{algorithm.name}: the given module's structure changed"
    for (name, old, version), (_, new, new_version) in zip(before[1], after[1], strict=True):
        assert version == new_version and torch.equal(old, new), f"{algorithm.name}: the given module's {name!r} changed"
    assert once_static.module is not module, f"{algorithm.name}: returned the given module instead of a new one"
    assert not rewrites(once_static.module), f"{algorithm.name}: still claims submodules once applied"
    twice_static, twice = run_host_event(Event.INIT, plan, once_static, once, start)
    assert repr(twice_static.module) == repr(once_static.module), f"{algorithm.name}: applying twice changed the model"
    _assert_states_equal(once, twice, f"{algorithm.name}: applying twice")
    input = plain.batches[0] if plain.input_key is None else plain.batches[0][0]
    first, second = _outputs(once_static, once, input), _outputs(twice_static, twice, input)
    if not isinstance(first, Tensor):
        first, second = logits_of(first), logits_of(second)
    assert torch.equal(first, second), f"{algorithm.name}: applying twice changed the outputs"
    if on is not None:
        # Aliased and tied submodules are checked on the suite's own models, where they are built in.
        return
    _check_aliased_submodule(algorithm, chosen, module, once_static, once, input, seed)
    _check_tied_weights(algorithm, chosen, module, seed)


ALIAS = "contract_alias"
"""The second name ``check_surgery`` registers a rewritten submodule under."""

TWIN = "contract_twin"
"""The name of the layer ``check_surgery`` adds that shares every tensor of a rewritten submodule."""


def _rewritten(algorithm: Algorithm, chosen: CheckSettings, model: nn.Module, seed: int) -> tuple[Static, State]:
    setup = make_setup([], seed=seed, modality=chosen.modality, model=model)
    start = Timestamp().with_max_duration(setup.max_duration)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_host_event(Event.INIT, make_plan([algorithm], timestamp=start), setup.static, setup.state, start)


def _submodule_or_none(module: nn.Module, name: str) -> nn.Module | None:
    try:
        return module.get_submodule(name)
    except AttributeError:
        return None


def _first_target(algorithm: Algorithm, module: nn.Module) -> str | None:
    rewrites = algorithm.capabilities().rewrites
    assert rewrites is not None
    names = sorted(name for name in rewrites(module) if isinstance(_submodule_or_none(module, name), nn.Module))
    return names[0] if names else None


def _check_aliased_submodule(
    algorithm: Algorithm,
    chosen: CheckSettings,
    module: nn.Module,
    once_static: Static,
    once: State,
    input: Any,
    seed: int,
) -> None:
    # A submodule registered under a second name is rewritten under both: nothing of the original stays
    # reachable, and the result holds the tensors and computes the outputs of the model that lists it once.
    name = _first_target(algorithm, module)
    if name is None:
        return
    aliased = copying.deepcopy(module)
    aliased.register_module(ALIAS, aliased.get_submodule(name))
    static, state = _rewritten(algorithm, chosen, aliased, seed)
    result = static.module
    assert getattr(result, ALIAS) is _submodule_or_none(result, name), (
        f"{algorithm.name}: a submodule registered as {name!r} and {ALIAS!r} was rewritten under one name only"
    )
    originals = {id(m) for m in aliased.modules()} | {id(t) for t in [*aliased.parameters(), *aliased.buffers()]}
    reachable = [*result.modules(), *result.parameters(), *result.buffers()]
    assert not any(id(x) in originals for x in reachable), f"{algorithm.name}: the rewrite kept a part of its input"
    for what, ours, theirs in (("parameters", state.params, once.params), ("buffers", state.buffers, once.buffers)):
        assert sorted(ours) == sorted(theirs), (
            f"{algorithm.name}: an aliased submodule gave {what} {sorted(ours)}, listed once {sorted(theirs)}"
        )
        assert all(torch.equal(ours[key], theirs[key]) for key in ours), f"{algorithm.name}: aliased {what} differ"
    first, second = _outputs(static, state, input), _outputs(once_static, once, input)
    assert torch.equal(first, second), f"{algorithm.name}: an aliased submodule changed the outputs"


def _tied_model(algorithm: Algorithm, chosen: CheckSettings, module: nn.Module) -> nn.Module | None:
    tied = copying.deepcopy(module)
    if chosen.modality == "tokens":
        # The usual tie of a language model: the output layer reads the token embedding's weight.
        head, embedding = getattr(tied, "head", None), getattr(tied, "token_embedding", None)
        if not isinstance(head, nn.Linear) or not isinstance(embedding, nn.Embedding):
            return None
        head.weight = embedding.weight
        return tied
    name = _first_target(algorithm, tied)
    if name is None:
        return None
    # A second layer holding the very tensors of a rewritten one, as a shared stem or a tied decoder does.
    layer = tied.get_submodule(name)
    twin = copying.deepcopy(layer)
    for owner, original in zip(twin.modules(), layer.modules(), strict=True):
        owner._parameters.update(original._parameters)
        owner._buffers.update(original._buffers)
    tied.register_module(TWIN, twin)
    return tied


def _carried_over(result: nn.Module, name: str, value: Tensor) -> list[Tensor]:
    # The tensor at ``name`` in the result, or one wrapper deeper (``a.weight`` as ``a.conv.weight``), where
    # the rewrite kept its value.
    path, _, attribute = name.rpartition(".")
    prefix, depth = (f"{path}." if path else ""), name.count(".") + 1
    found = [
        tensor
        for candidate, tensor in result.named_parameters(remove_duplicate=False)
        if candidate == name
        or (candidate.startswith(prefix) and candidate.endswith(f".{attribute}") and candidate.count(".") == depth)
    ]
    return [tensor for tensor in found if tensor.shape == value.shape and torch.equal(tensor.detach(), value)]


def _check_tied_weights(algorithm: Algorithm, chosen: CheckSettings, module: nn.Module, seed: int) -> None:
    # Tensors tied before the rewrite and carried over by it stay one tensor (one entry of the state).
    tied = _tied_model(algorithm, chosen, module)
    if tied is None:
        return
    groups: dict[int, list[str]] = {}
    for name, parameter in tied.named_parameters(remove_duplicate=False):
        groups.setdefault(id(parameter), []).append(name)
    static, _ = _rewritten(algorithm, chosen, tied, seed)
    for names in (group for group in groups.values() if len(group) > 1):
        value = tied.get_parameter(names[0]).detach()
        carried = [_carried_over(static.module, name, value) for name in names]
        if all(carried):
            kept = {id(tensor) for found in carried for tensor in found}
            assert len(kept) == 1, f"{algorithm.name}: the tied parameters {names} are no longer one tensor"


_BEFORE_FORWARD = (Event.AFTER_DATALOADER, Event.BEFORE_TRAIN_BATCH, Event.BEFORE_FORWARD)
IMAGE_DTYPES: tuple[torch.dtype, ...] = (torch.uint8, torch.float16, torch.bfloat16, torch.float32)


def _as_dtype(images: Tensor, dtype: torch.dtype) -> Tensor:
    if dtype == torch.uint8:
        return (images.sigmoid() * 255).round().to(torch.uint8)
    return images.sigmoid().to(dtype)


def check_dtypes(algorithm: Algorithm, *, seed: int = 0) -> None:
    """Raises AssertionError unless the input-side hooks keep the input's dtype, rank and channels.

    Image inputs are tried as uint8 (0-255) and float16, bfloat16 and float32 (in [0, 1]); token inputs as
    int64. Hooks up to BEFORE_FORWARD run on them (after BATCH_START). An algorithm may refuse a dtype, but only
    with a TypeError or ValueError that names it. The extra forward, for algorithms that ask for one, sees the
    input as float32, as a model that normalises its input would.
    """
    setup = make_setup([algorithm], seed=seed)
    images = modality_of(setup.algorithms) == "image"
    dtypes = IMAGE_DTYPES if images else (torch.int64,)
    model_forward = make_forward(setup.static)
    for dtype in dtypes:
        first = setup.batches[0]
        input = _as_dtype(first[0], dtype) if images else first[0]
        batch = (input, first[1])
        meta = batch_meta(batch)
        timestamp = Timestamp().with_max_duration(setup.max_duration)
        plan = make_plan(setup.algorithms, timestamp=timestamp, meta=meta)
        try:
            static, state = run_host_event(Event.BATCH_START, plan, setup.static, setup.state, timestamp, meta)
            ctx = StepCtx(
                batch=batch,
                key=R.fold_in(state.key, state.step),
                loss_fn=setup.loss_fn,
                forward=lambda p, b, x: model_forward(p, b, x.float() if images else x),
                per_sample_loss_fn=setup.per_sample_loss_fn,
            )
            for event in _BEFORE_FORWARD:
                state, ctx = run_event(event, plan, state, ctx)
        except (TypeError, ValueError) as error:
            assert str(dtype) in str(error) or str(dtype).removeprefix("torch.") in str(error), (
                f"{algorithm.name}: refused {dtype} with an error that does not name it: {error}"
            )
            continue
        output = ctx.batch[0]
        assert output.dtype == dtype, f"{algorithm.name}: {dtype} input came out as {output.dtype}"
        assert output.dim() == input.dim(), f"{algorithm.name}: {tuple(input.shape)} became {tuple(output.shape)}"
        if images:
            assert output.shape[1] == input.shape[1], f"{algorithm.name}: the channel count changed"


def make_forward(static: Static) -> ForwardFn:
    """Returns ``forward(params, buffers, input) -> (outputs, new_buffers)`` for ``static``'s module."""

    def forward(params: Any, buffers: Any, input: Any) -> tuple[Any, dict[str, Tensor]]:
        new_buffers = {name: b.clone() for name, b in buffers.items()}
        with torch.no_grad():
            outputs = functional_call(static.module, (dict(params), new_buffers), (input,))
        return outputs, new_buffers

    return forward


def check_composes(first: Algorithm, second: Algorithm, *, seed: int = 0, on: On | None = None) -> None:
    """Raises AssertionError unless the two algorithms train together with finite losses."""
    _, losses = train_steps(make_setup([first, second], seed=seed, **_on(on)))
    for step, loss in enumerate(losses):
        assert torch.isfinite(loss), f"{first.name} + {second.name}: loss {step} is {float(loss)}"


CHECKS: tuple[Callable[..., None], ...] = (
    check_surgery,
    check_purity,
    check_determinism,
    check_keys_matter,
    check_dtypes,
    check_compiled_matches_eager,
    check_checkpoint_round_trip,
)
"""The single-algorithm checks, in the order the suite runs them."""
