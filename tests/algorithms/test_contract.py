"""Every registered algorithm passes the contract suite, alone and paired with every other one."""

from __future__ import annotations

import itertools

import pytest

import composer_fn.algorithms  # noqa: F401  (registers every algorithm)
from composer_fn.core import random as R
from composer_fn.core.algorithm import REGISTRY
from composer_fn.testing import CHECKS, check_composes
from composer_fn.testing.settings import SETTINGS, CheckSettings, example, settings_for

ALGORITHMS = sorted(REGISTRY)


def test_the_registry_holds_the_foundation_algorithms() -> None:
    assert {"channels_last", "label_smoothing", "mixup"} <= set(ALGORITHMS)


def test_every_registered_algorithm_has_check_settings() -> None:
    # Without settings an algorithm would be checked with defaults that may never exercise it.
    missing = sorted(set(REGISTRY) - set(SETTINGS))
    assert not missing, f"no check settings for {missing}: add them to composer_fn.testing.settings.SETTINGS"


def test_an_example_is_an_instance_of_its_algorithm() -> None:
    for name in ALGORITHMS:
        assert type(example(name)) is REGISTRY[name]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_algorithm_honours_the_contract(name: str, check) -> None:
    check(example(name))


# Algorithms for image batches and for token batches never meet in one run; every pair of one kind does.
PAIRS = [
    (a, b)
    for a, b in itertools.combinations(ALGORITHMS, 2)
    if settings_for(a).modality == settings_for(b).modality
]


@pytest.mark.parametrize("pair", PAIRS, ids="+".join)
def test_every_two_algorithms_compose(pair: tuple[str, str]) -> None:
    first, second = pair
    check_composes(example(first), example(second))


def test_purity_check_catches_an_algorithm_that_writes_into_its_input() -> None:
    from dataclasses import dataclass

    from composer_fn.core.algorithm import Algorithm
    from composer_fn.core.event import Event
    from composer_fn.testing import check_purity

    @dataclass(frozen=True)
    class WritesIntoInput(Algorithm):
        def traced_hooks(self, plan_key=()):
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
        def traced_hooks(self, plan_key=()):
            return {Event.BEFORE_FORWARD: lambda state, ctx: (state, ctx.replace(batch=(ctx.batch[0] * 0.5, ctx.batch[1])))}

    @dataclass(frozen=True)
    class HidesRandomness(Algorithm):
        def traced_hooks(self, plan_key=()):
            return {Event.BEFORE_FORWARD: self._noise}

        def _noise(self, state, ctx):
            noise = R.normal(ctx.key, ctx.batch[0].shape)
            return state, ctx.replace(batch=(ctx.batch[0] + noise, ctx.batch[1]))

    with pytest.raises(AssertionError, match="same parameters"):
        check_keys_matter(ClaimsRandomness(), settings=CheckSettings(stochastic=lambda a: True))
    with pytest.raises(AssertionError, match="declared deterministic"):
        check_keys_matter(HidesRandomness())


def test_dtype_check_catches_an_algorithm_that_changes_the_input_dtype() -> None:
    from dataclasses import dataclass

    from composer_fn.core.algorithm import Algorithm
    from composer_fn.core.event import Event
    from composer_fn.testing import check_dtypes

    @dataclass(frozen=True)
    class Promotes(Algorithm):
        def traced_hooks(self, plan_key=()):
            return {Event.AFTER_DATALOADER: lambda state, ctx: (state, ctx.replace(batch=(ctx.batch[0] * 0.5, ctx.batch[1])))}

    with pytest.raises(AssertionError, match="came out as"):
        check_dtypes(Promotes())


def _relu_surgeries():
    from dataclasses import dataclass

    from torch import nn

    from composer_fn.algorithms._surgery import Surgery, matching_modules, replace_modules

    def relus(module):
        return frozenset(matching_modules(module, lambda name, m: type(m) is nn.ReLU))

    @dataclass(frozen=True)
    class ReluToGelu(Surgery):
        def targets(self, module):
            return relus(module)

        def rewrite(self, module, key):
            return replace_modules(module, {name: nn.GELU() for name in relus(module)})

    @dataclass(frozen=True)
    class InPlace(ReluToGelu):
        # Skips the base class's copy and edits the structure it was given.
        def _operate(self, static, state, timestamp, meta):
            module = static.module
            for name in relus(module):
                owner, _, attribute = name.rpartition(".")
                setattr(module.get_submodule(owner), attribute, nn.GELU())
            return static.replace(module=module), state

    @dataclass(frozen=True)
    class Stacks(ReluToGelu):
        def targets(self, module):
            return frozenset({"features"})

        def rewrite(self, module, key):
            return replace_modules(module, {"features": nn.Sequential(module.features, nn.Identity())})

    return ReluToGelu(), InPlace(), Stacks()


def test_surgery_check_passes_a_pure_idempotent_rewrite_and_catches_the_others() -> None:
    from composer_fn.testing import check_surgery

    pure, in_place, stacks = _relu_surgeries()
    check_surgery(pure)
    with pytest.raises(AssertionError, match="given module's structure changed"):
        check_surgery(in_place)
    with pytest.raises(AssertionError, match="still claims submodules once applied"):
        check_surgery(stacks)


def test_two_surgeries_that_claim_the_same_module_are_refused_before_training() -> None:
    from dataclasses import dataclass

    from composer_fn.data import TensorLoader, load_digits_task
    from composer_fn.models import SmallCNN
    from composer_fn.optim import sgd
    from composer_fn.trainer import Trainer

    pure, _, _ = _relu_surgeries()

    @dataclass(frozen=True)
    class Other(type(pure)):  # type: ignore[misc]
        pass

    task = load_digits_task()
    with pytest.raises(ValueError, match="both rewrite submodule 'features.0.2'"):
        Trainer(
            SmallCNN(), TensorLoader(task.train, 64), max_duration="1ba", optimizer=sgd(0.1), algorithms=[pure, Other()],
            progress_bar=False,
        )
