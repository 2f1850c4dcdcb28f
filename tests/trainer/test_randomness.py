"""The model's own draws: seeded for each step from the run's key, the step and the microbatch's place, and put
back after it."""

from __future__ import annotations

import torch
import torchvision
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from composer_fn import Trainer
from composer_fn.data import TensorLoader
from composer_fn.models import MLP
from composer_fn.nn import KeyedDropout
from composer_fn.optim import sgd
from composer_fn.trainer.randomness import ModelDraws, draws_nothing, model_seed


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    steps=st.lists(st.integers(0, 2**31), min_size=1, max_size=6),
    offsets=st.lists(st.integers(0, 2**40), min_size=1, max_size=3),
)
def test_each_step_draws_from_the_seed_a_hand_loop_sets_and_the_generator_is_put_back(
    seed: int, steps: list[int], offsets: list[int]
) -> None:
    draws = ModelDraws(seed, torch.device("cpu"))
    # Consecutive steps (one stretch of seeds), then jumps past it and back, at several offsets.
    visited = [s + d for s in steps for d in (0, 1, 255, 256, 300)] + steps
    outside = torch.default_generator.get_state()
    for offset in offsets:
        for step in visited:
            with draws.around(step, offset):
                drawn = torch.rand(3)
            torch.manual_seed(model_seed(seed, step, offset))
            assert torch.equal(drawn, torch.rand(3)), (step, offset)
            torch.default_generator.set_state(outside)
        assert torch.equal(torch.default_generator.get_state(), outside)


def test_a_microbatch_reseeds_from_its_own_place_and_the_first_step_tells_whether_the_model_drew() -> None:
    draws = ModelDraws(7, torch.device("cpu"))
    saved = draws.enter(3, 0)
    first = torch.rand(2)
    draws.reseed(32)
    second = torch.rand(2)
    draws.leave(saved)
    assert draws.drew is True
    torch.manual_seed(model_seed(7, 3, 0))
    assert torch.equal(first, torch.rand(2))
    torch.manual_seed(model_seed(7, 3, 32))
    assert torch.equal(second, torch.rand(2))
    quiet = ModelDraws(7, torch.device("cpu"))
    with quiet.around(0, 0):
        pass
    assert quiet.drew is False


_QUIET_LAYERS = {
    "linear": lambda: nn.Linear(6, 6),
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "layer_norm": lambda: nn.LayerNorm(6),
    "batch_norm": lambda: nn.BatchNorm1d(6),
    "keyed_dropout": lambda: KeyedDropout(0.5),
    "nested": lambda: nn.Sequential(nn.Linear(6, 6), nn.Tanh()),
}
_DRAWING_LAYERS = {
    "dropout": lambda: nn.Dropout(0.5),
    "rrelu": nn.RReLU,
    "alpha_dropout": lambda: nn.AlphaDropout(0.5),
    "a forward of the user's": lambda: _NoisyLayer(),
}


class _NoisyLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.01 * torch.randn_like(x)


@settings(max_examples=30, deadline=None)
@given(layers=st.lists(st.sampled_from(sorted({**_QUIET_LAYERS, **_DRAWING_LAYERS})), min_size=1, max_size=5))
def test_a_model_said_to_draw_nothing_leaves_the_generator_where_it_was_and_one_with_a_drawing_layer_is_not(
    layers: list[str],
) -> None:
    made = {**_QUIET_LAYERS, **_DRAWING_LAYERS}
    model = nn.Sequential(*(made[name]() for name in layers)).train()
    quiet = draws_nothing(model)
    assert quiet == all(name in _QUIET_LAYERS for name in layers)
    before = torch.default_generator.get_state()
    inputs = torch.randn(4, 6, generator=torch.Generator().manual_seed(0), requires_grad=True)
    model(inputs).square().sum().backward()
    if quiet:
        assert torch.equal(torch.default_generator.get_state(), before)


def test_hooks_a_forward_of_its_own_and_other_layers_may_draw() -> None:
    assert draws_nothing(MLP(8, 3, hidden=(4,)))
    assert draws_nothing(MLP(8, 3, hidden=(4,), dropout=0.5))  # keyed: drawn from the step's key
    hooked = nn.Sequential(nn.Linear(4, 4))
    hooked[0].register_forward_hook(lambda module, args, output: output + torch.rand_like(output))
    assert not draws_nothing(hooked)
    replaced = nn.Sequential(nn.Linear(4, 4))
    replaced[0].forward = lambda x: x * torch.rand_like(x)  # type: ignore[method-assign]
    assert not draws_nothing(replaced)
    assert not draws_nothing(nn.Sequential(nn.Linear(4, 4), nn.MultiheadAttention(4, 1, dropout=0.1)))
    assert not draws_nothing(torchvision.models.resnet18(num_classes=3))  # a forward of its own: not looked into
    handle = nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
    try:
        assert not draws_nothing(MLP(8, 3, hidden=(4,)))
    finally:
        handle.remove()


def _train(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    data = TensorLoader((torch.randn(64, 6, generator=generator), torch.randint(0, 3, (64,), generator=generator)), 16)
    torch.manual_seed(seed)  # the global generator's state before the run must not matter
    trainer = Trainer(model, data, max_duration="2ep", optimizer=sgd(0.1), seed=5, progress_bar=False, device="cpu")
    trainer.fit()
    return trainer.state.params


def test_a_run_whose_model_draws_through_a_hook_is_still_seeded_from_the_run_and_one_that_cannot_draw_is_the_same() -> None:
    def noisy() -> nn.Module:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        model[1].register_forward_hook(lambda module, args, output: output * (torch.rand_like(output) > 0.3))
        return model

    first, second = _train(noisy(), seed=1), _train(noisy(), seed=2)
    assert all(torch.equal(first[name], second[name]) for name in first)
    plain = [_train(MLP(6, 3, hidden=(8,)), seed=s) for s in (1, 2)]
    assert all(torch.equal(plain[0][name], plain[1][name]) for name in plain[0])
