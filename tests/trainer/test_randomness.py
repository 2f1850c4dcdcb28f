"""The model's own draws: seeded for each step from the run's key, the step and the microbatch's place, and put
back after it."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_fn.trainer.randomness import ModelDraws, model_seed


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
