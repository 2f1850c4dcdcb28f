"""A schedule evaluated on the host scales updates as the traced tensor path does."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.core import random as R
from composer_fn.optim import CosineAnnealingWithWarmupScheduler, scale_by_schedule


@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(6, 40))
def test_host_evaluated_schedule_equals_the_tensor_path(seed, warmup, total) -> None:
    schedule = CosineAnnealingWithWarmupScheduler(t_warmup=f"{warmup}ba", alpha_f=0.1).resolve(
        steps_per_epoch=10, max_steps=total
    )
    updates = {"w": R.normal(R.key(seed), (3, 4)), "b": R.normal(R.fold_in(R.key(seed), 1), (4,))}
    host, traced = scale_by_schedule(schedule, host_evaluable=True), scale_by_schedule(schedule)
    host_state, traced_state = host.init(updates), traced.init(updates)
    for _ in range(total + 2):
        host_out, host_state = host.update(updates, host_state)
        traced_out, traced_state = traced.update(updates, traced_state)
        for name in updates:
            torch.testing.assert_close(host_out[name], traced_out[name], rtol=1e-6, atol=1e-7)
        assert torch.equal(host_state.count, traced_state.count)
