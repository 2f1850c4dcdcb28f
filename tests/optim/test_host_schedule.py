"""A schedule evaluated on the host scales updates as the traced tensor path does."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from composer_fn.core import random as R
from composer_fn.optim import (
    CosineAnnealingWarmRestartsScheduler,
    CosineAnnealingWithWarmupScheduler,
    ExponentialScheduler,
    MultiStepScheduler,
    MultiStepWithWarmupScheduler,
    PolynomialScheduler,
    PolynomialWithWarmupScheduler,
    StepScheduler,
    scale_by_schedule,
)


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


@pytest.mark.parametrize(
    "schedule",
    [
        StepScheduler(step_size="3ba", gamma=0.5),
        MultiStepScheduler(milestones=("4ba", "0.5dur")),
        ExponentialScheduler(gamma=0.8, decay_period="2ba"),
        CosineAnnealingWarmRestartsScheduler(t_0="3ba", t_mult=1.5, alpha_f=0.1),
        PolynomialScheduler(power=2.0, alpha_f=0.05),
        MultiStepWithWarmupScheduler(t_warmup="2ba", milestones=("5ba",)),
        PolynomialWithWarmupScheduler(t_warmup="3ba", power=1.5),
    ],
)
@given(st.integers(0, 2**32 - 1), st.integers(6, 40))
def test_host_evaluated_decay_and_restart_schedules_equal_the_tensor_path(schedule, seed, total) -> None:
    resolved = schedule.resolve(steps_per_epoch=10, max_steps=total)
    updates = {"w": R.normal(R.key(seed), (3, 4))}
    host, traced = scale_by_schedule(resolved, host_evaluable=True), scale_by_schedule(resolved)
    host_state, traced_state = host.init(updates), traced.init(updates)
    for _ in range(total + 2):
        host_out, host_state = host.update(updates, host_state)
        traced_out, traced_state = traced.update(updates, traced_state)
        torch.testing.assert_close(host_out["w"], traced_out["w"], rtol=1e-6, atol=1e-7)
