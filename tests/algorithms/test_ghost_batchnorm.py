"""GhostBatchNorm: BatchNorm when one chunk, Composer's chunked BatchNorm with divided momentum otherwise."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from composer_fn.algorithms.ghost_batchnorm import (
    GhostBatchNorm,
    GhostBatchNorm1d,
    GhostBatchNorm2d,
    GhostBatchNorm3d,
    apply_ghost_batchnorm,
    ghost_batchnorm_from,
)
from composer_fn.core import random as R
from composer_fn.models import SmallCNN
from composer_fn.testing import make_setup
from composer_fn.testing.settings import example

seeds = st.integers(0, 2**32 - 1)
SHAPES = {nn.BatchNorm1d: (3, 2), nn.BatchNorm2d: (3, 4, 4), nn.BatchNorm3d: (3, 2, 2, 2)}


def _batchnorm(kind: type[nn.modules.batchnorm._BatchNorm], seed: int, momentum: float = 0.1) -> nn.Module:
    layer = kind(3, momentum=momentum)
    # Statistics and affine parameters away from their defaults, so that every one of them matters.
    with torch.no_grad():
        layer.weight.copy_(R.uniform(R.fold_in(R.key(seed), 1), (3,), low=0.5, high=1.5))
        layer.bias.copy_(R.normal(R.fold_in(R.key(seed), 2), (3,)))
        layer.running_mean.copy_(R.normal(R.fold_in(R.key(seed), 3), (3,)))
        layer.running_var.copy_(R.uniform(R.fold_in(R.key(seed), 4), (3,), low=0.5, high=2.0))
    return layer


def _batch(kind: type[nn.Module], seed: int, size: int) -> torch.Tensor:
    return R.normal(R.fold_in(R.key(seed), 5), (size, *SHAPES[kind])) * 2 + 1


def _state(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in layer.state_dict().items()}


kinds = st.sampled_from(list(SHAPES))


@given(seeds, kinds, st.integers(2, 12), st.integers(0, 4))
@settings(max_examples=10, deadline=None)
def test_a_ghost_batch_as_large_as_the_batch_is_batchnorm_in_training_and_evaluation(seed, kind, size, extra):
    plain = _batchnorm(kind, seed)
    ghost = ghost_batchnorm_from(plain, size + extra)
    x = _batch(kind, seed, size)
    assert torch.equal(ghost(x), plain(x))
    assert all(torch.equal(t, _state(plain)[n]) for n, t in _state(ghost).items())
    ghost.eval(), plain.eval()
    assert torch.equal(ghost(x), plain(x))


@given(seeds, kinds, st.integers(2, 40), st.integers(1, 16), st.sampled_from([0.1, 0.5]))
@settings(max_examples=10, deadline=None)
def test_training_normalizes_composers_chunks_with_the_momentum_divided_among_them(
    seed, kind, size, ghost_size, momentum
):
    plain = _batchnorm(kind, seed, momentum)
    ghost = ghost_batchnorm_from(plain, ghost_size)
    x = _batch(kind, seed, size)
    # Composer: chunk(ceil(B / g)), one BatchNorm call per chunk with momentum / chunks, concatenated.
    chunks = x.chunk(max(1, math.ceil(size / ghost_size)), dim=0)
    reference = copy.deepcopy(plain)
    reference.momentum = momentum / len(chunks)
    expected = torch.cat([reference(chunk) for chunk in chunks])
    output = ghost(x)
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-6)
    for name, tensor in _state(ghost).items():
        torch.testing.assert_close(tensor, _state(reference)[name], rtol=0, atol=1e-6)


def test_a_batch_that_the_ghost_size_does_not_divide_is_chunked_as_torch_chunk_does() -> None:
    ghost = GhostBatchNorm1d(2, ghost_batch_size=32, affine=False)
    x = R.normal(R.key(0), (70, 2)) * 5 + 3
    output = ghost(x)
    # ceil(70 / 32) = 3 chunks of ceil(70 / 3) = 24 samples: 24, 24 and 22, each with mean 0.
    for start, stop in ((0, 24), (24, 48), (48, 70)):
        torch.testing.assert_close(output[start:stop].mean(0), torch.zeros(2), rtol=0, atol=1e-5)
    assert not torch.allclose(output[:32].mean(0), torch.zeros(2), atol=1e-3)
    assert int(ghost.num_batches_tracked) == 3


def test_a_batch_smaller_than_the_ghost_size_is_one_chunk() -> None:
    plain = nn.BatchNorm2d(3)
    ghost = ghost_batchnorm_from(plain, 32)
    x = R.normal(R.key(1), (5, 3, 2, 2))
    assert torch.equal(ghost(x), plain(x))


@given(seeds, st.integers(1, 8))
@settings(max_examples=10, deadline=None)
def test_the_rewrite_replaces_every_batchnorm_and_leaves_the_input_model_alone(seed, ghost_size) -> None:
    model = SmallCNN(in_channels=3, num_classes=4, width=4)
    before = {name: (id(t), t.clone(), t._version) for name, t in model.state_dict(keep_vars=True).items()}
    rewritten = GhostBatchNorm(ghost_size).rewrite(model, R.key(seed))
    ghosts = [m for m in rewritten.modules() if isinstance(m, GhostBatchNorm2d)]
    assert len(ghosts) == 3 and all(g.ghost_batch_size == ghost_size for g in ghosts)
    assert not any(isinstance(m, GhostBatchNorm2d) for m in model.modules())
    for name, tensor in model.state_dict(keep_vars=True).items():
        identity, value, version = before[name]
        assert id(tensor) == identity and tensor._version == version and torch.equal(tensor, value)
    assert not {id(t) for t in model.state_dict(keep_vars=True).values()} & {
        id(t) for t in rewritten.state_dict(keep_vars=True).values()
    }


@given(seeds, st.integers(1, 8))
@settings(max_examples=5, deadline=None)
def test_ghosting_twice_equals_ghosting_once(seed, ghost_size) -> None:
    algorithm = GhostBatchNorm(ghost_size)
    once = algorithm.rewrite(SmallCNN(in_channels=3, num_classes=4, width=4), R.key(0))
    twice = algorithm.rewrite(once, R.key(0))
    assert algorithm.targets(once) == frozenset() and repr(twice) == repr(once)
    x = R.normal(R.fold_in(R.key(seed), 1), (9, 3, 8, 8))
    assert torch.equal(twice(x), once(x))
    assert all(torch.equal(t, once.state_dict()[n]) for n, t in twice.state_dict().items())


def test_the_algorithm_keeps_the_tensor_names_and_values() -> None:
    plain = make_setup([])
    ghosted = make_setup([example("ghost_batchnorm")])
    assert ghosted.state.params.keys() == plain.state.params.keys()
    assert ghosted.state.buffers.keys() == plain.state.buffers.keys()
    assert sum(isinstance(m, GhostBatchNorm2d) for m in ghosted.static.module.modules()) == 3


def test_compiled_training_with_several_chunks_matches_eager(fresh_compiler) -> None:
    eager = ghost_batchnorm_from(_batchnorm(nn.BatchNorm2d, 0), 3)
    compiled = copy.deepcopy(eager)
    x = _batch(nn.BatchNorm2d, 0, 8)
    expected = eager(x)
    output = torch.compile(compiled, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(output, expected, rtol=0, atol=1e-6)
    for name, tensor in _state(eager).items():
        torch.testing.assert_close(_state(compiled)[name], tensor, rtol=0, atol=1e-6)
    assert int(compiled.num_batches_tracked) == 3


def test_every_batchnorm_dimension_has_its_ghost() -> None:
    model = nn.Sequential(nn.BatchNorm1d(2), nn.BatchNorm2d(2), nn.BatchNorm3d(2))
    ghosted = apply_ghost_batchnorm(model, 4)
    assert [type(m) for m in ghosted] == [GhostBatchNorm1d, GhostBatchNorm2d, GhostBatchNorm3d]


@pytest.mark.parametrize("value", [0, -3, 2.0, True])
def test_a_bad_ghost_batch_size_is_refused_naming_it(value) -> None:
    with pytest.raises(ValueError, match="ghost_batch_size"):
        GhostBatchNorm(value)
    with pytest.raises(ValueError, match="ghost_batch_size"):
        apply_ghost_batchnorm(nn.BatchNorm1d(2), value)
