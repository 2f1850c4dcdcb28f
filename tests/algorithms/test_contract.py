"""Every registered algorithm passes the contract suite, alone and paired with every other one."""

from __future__ import annotations

import itertools

import pytest

import composer_fn.algorithms  # noqa: F401  (registers every algorithm)
from composer_fn.core import random as R
from composer_fn.core.algorithm import REGISTRY
from composer_fn.testing import CHECKS, check_composes

ALGORITHMS = sorted(REGISTRY)


def test_the_registry_holds_the_foundation_algorithms() -> None:
    assert {"channels_last", "label_smoothing", "mixup"} <= set(ALGORITHMS)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_algorithm_honours_the_contract(name: str, check) -> None:
    check(REGISTRY[name].for_checks())


# Algorithms for image batches and for token batches never meet in one run; every pair of one kind does.
PAIRS = [
    (a, b) for a, b in itertools.combinations(ALGORITHMS, 2) if REGISTRY[a].modality == REGISTRY[b].modality
]


@pytest.mark.parametrize("pair", PAIRS, ids="+".join)
def test_every_two_algorithms_compose(pair: tuple[str, str]) -> None:
    first, second = pair
    check_composes(REGISTRY[first].for_checks(), REGISTRY[second].for_checks())


def test_purity_check_catches_an_algorithm_that_writes_into_its_input() -> None:
    from dataclasses import dataclass

    from composer_fn.core.algorithm import Algorithm
    from composer_fn.core.event import Event
    from composer_fn.testing import check_purity

    @dataclass(frozen=True)
    class WritesIntoInput(Algorithm):
        def traced_hooks(self):
            return {Event.BEFORE_FORWARD: self._scale}

        def _scale(self, state, ctx):
            ctx.batch[0].mul_(0.5)
            return state, ctx

    with pytest.raises(AssertionError, match="written in place|changed value"):
        check_purity(WritesIntoInput())


def test_keys_check_catches_a_stochastic_algorithm_that_ignores_its_key() -> None:
    from dataclasses import dataclass

    from composer_fn.core.algorithm import Algorithm
    from composer_fn.core.event import Event
    from composer_fn.testing import check_keys_matter

    @dataclass(frozen=True)
    class ClaimsRandomness(Algorithm):
        @property
        def stochastic(self) -> bool:
            return True

        def traced_hooks(self):
            return {Event.BEFORE_FORWARD: lambda state, ctx: (state, ctx.replace(batch=(ctx.batch[0] * 0.5, ctx.batch[1])))}

    @dataclass(frozen=True)
    class HidesRandomness(Algorithm):
        def traced_hooks(self):
            return {Event.BEFORE_FORWARD: self._noise}

        def _noise(self, state, ctx):
            noise = R.normal(ctx.key, ctx.batch[0].shape)
            return state, ctx.replace(batch=(ctx.batch[0] + noise, ctx.batch[1]))

    with pytest.raises(AssertionError, match="same parameters"):
        check_keys_matter(ClaimsRandomness())
    with pytest.raises(AssertionError, match="declared deterministic"):
        check_keys_matter(HidesRandomness())


def test_dtype_check_catches_an_algorithm_that_changes_the_input_dtype() -> None:
    from dataclasses import dataclass

    from composer_fn.core.algorithm import Algorithm
    from composer_fn.core.event import Event
    from composer_fn.testing import check_dtypes

    @dataclass(frozen=True)
    class Promotes(Algorithm):
        def traced_hooks(self):
            return {Event.AFTER_DATALOADER: lambda state, ctx: (state, ctx.replace(batch=(ctx.batch[0] * 0.5, ctx.batch[1])))}

    with pytest.raises(AssertionError, match="came out as"):
        check_dtypes(Promotes())
