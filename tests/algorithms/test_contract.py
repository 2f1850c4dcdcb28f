"""Every registered algorithm passes the contract suite, alone and paired with every other one."""

from __future__ import annotations

import itertools

import pytest

import composer_fn.algorithms  # noqa: F401  (registers every algorithm)
from composer_fn.core.algorithm import REGISTRY
from composer_fn.testing import CHECKS, check_composes

ALGORITHMS = sorted(REGISTRY)


def test_the_registry_holds_the_foundation_algorithms() -> None:
    assert {"channels_last", "label_smoothing", "mixup"} <= set(ALGORITHMS)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_algorithm_honours_the_contract(name: str, check) -> None:
    check(REGISTRY[name]())


@pytest.mark.parametrize("pair", list(itertools.combinations(ALGORITHMS, 2)), ids="+".join)
def test_every_two_algorithms_compose(pair: tuple[str, str]) -> None:
    first, second = pair
    check_composes(REGISTRY[first](), REGISTRY[second]())


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
