"""The algorithms' state records survive a checkpoint file bit for bit, and the layouts checkpoints held before
the states were records (EMA's and SWA's dictionaries, EarlyStopper's five packed values) load into them."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn.algorithms.ema import EMAState
from composer_fn.algorithms.stopping import StopperState
from composer_fn.algorithms.swa import SWAState
from composer_fn.core import random as R
from composer_fn.core.state import State
from composer_fn.core.time import Timestamp
from composer_fn.trainer.checkpoint import load_checkpoint, save_checkpoint

NAMES = ("layer.weight", "layer.bias", "head.weight")


def _float32(shape: tuple[int, ...]) -> st.SearchStrategy[torch.Tensor]:
    count = 1 if not shape else shape[0] * (shape[1] if len(shape) > 1 else 1)
    values = st.lists(st.floats(width=32), min_size=count, max_size=count)
    return values.map(lambda v: torch.tensor(v, dtype=torch.float32).reshape(shape))


shapes = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 2)), min_size=len(NAMES), max_size=len(NAMES))


@st.composite
def weights(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    return {name: draw(_float32(shape)) for name, shape in zip(NAMES, draw(shapes), strict=True)}


def _like(tensors: dict[str, torch.Tensor], values: st.DrawFn) -> dict[str, torch.Tensor]:
    return {name: values(_float32(tuple(t.shape))) for name, t in tensors.items()}


@st.composite
def states(draw: st.DrawFn) -> State:
    params = draw(weights())
    buffers = {"norm.running_mean": draw(_float32((2,))), "norm.num_batches_tracked": torch.tensor(draw(st.integers(0, 2**40)))}
    ema = EMAState(
        params=_like(params, draw),
        buffers={"norm.running_mean": draw(_float32((2,))), "norm.num_batches_tracked": buffers["norm.num_batches_tracked"]},
        started=torch.tensor(draw(st.booleans())),
    )
    swa = SWAState(params=_like(params, draw), n_averaged=torch.tensor(draw(st.integers(0, 2**40)), dtype=torch.int64))
    stopper = StopperState(
        best=torch.tensor(draw(st.floats(allow_nan=False)), dtype=torch.float64),
        checks_since=torch.tensor(draw(st.integers(0, 2**40))),
        has_best=torch.tensor(draw(st.booleans())),
        best_batch=torch.tensor(draw(st.integers(0, 2**40))),
        best_epoch=torch.tensor(draw(st.integers(0, 2**20))),
    )
    return State(
        params=params,
        buffers=buffers,
        opt={},
        algos={"ema": ema, "swa": swa, "early_stopper": stopper, "threshold_stopper": None},
        hparams={},
        step=torch.tensor(draw(st.integers(0, 10**6))),
        key=R.key(draw(st.integers(0, 2**32))),
    )


def _template(state: State) -> State:
    return pytree.tree_map(torch.zeros_like, state)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8)


def _same_bits(actual: Any, expected: Any) -> None:
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert actual_spec == expected_spec
    for got, want in zip(actual_leaves, expected_leaves, strict=True):
        if want is None:  # an algorithm without state, a leaf of the plain mapping compared here
            assert got is None
            continue
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(_bits(got), _bits(want))


def _saved_and_loaded(state: State, template: State) -> State:
    with tempfile.TemporaryDirectory() as folder:
        path = save_checkpoint(Path(folder) / "state.pt", state, Timestamp(batch=3), "[]")
        return load_checkpoint(path, template).state


@settings(max_examples=25, deadline=None)
@given(state=states())
def test_the_algorithm_states_survive_a_checkpoint_bit_for_bit(state: State) -> None:
    loaded = _saved_and_loaded(state, _template(state))
    assert {name: type(entry) for name, entry in loaded.algos.items()} == {
        "ema": EMAState, "swa": SWAState, "early_stopper": StopperState, "threshold_stopper": type(None)
    }
    _same_bits(loaded.algos, state.algos)


@settings(max_examples=25, deadline=None)
@given(state=states())
def test_the_layouts_before_the_records_load_into_them_bit_for_bit(state: State) -> None:
    ema, swa, stopper = state.algos["ema"], state.algos["swa"], state.algos["early_stopper"]
    counts = (stopper.checks_since, stopper.has_best, stopper.best_batch, stopper.best_epoch)
    packed = torch.stack([stopper.best, *(t.to(torch.float64) for t in counts)])
    earlier = state.replace(
        algos={
            "ema": {"params": ema.params, "buffers": ema.buffers, "started": ema.started},
            "swa": {"params": swa.params, "n_averaged": swa.n_averaged},
            "early_stopper": packed,
            "threshold_stopper": None,
        }
    )
    loaded = _saved_and_loaded(earlier, _template(state))
    _same_bits(loaded.algos, state.algos)
