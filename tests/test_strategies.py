"""The public strategies draw what they promise: keys, batches, time and hyperparameters that construct."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from composer_fn.core import random as R
from composer_fn.core.algorithm import REGISTRY, Algorithm, algorithm_from_config
from composer_fn.core.schedule import Action, Progress, next_tick, run_schedule
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.testing import strategies as S
from composer_fn.testing.settings import settings_for

IMAGE_DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32)
FORMATS = (torch.contiguous_format, torch.channels_last)
BUILTIN = sorted(
    name for name, cls in REGISTRY.items() if cls.__module__.startswith("composer_fn.algorithms.")
)
SEARCH = settings(max_examples=300, database=None, deadline=None)
fast = settings(max_examples=25, deadline=None)


def sizes(least: int, most: int) -> st.SearchStrategy[int | tuple[int, int]]:
    pairs = st.tuples(st.integers(least, most), st.integers(least, most)).map(lambda p: (min(p), max(p)))
    return st.one_of(st.integers(least, most), pairs)


def within(value: int, size: int | tuple[int, int]) -> bool:
    least, most = (size, size) if isinstance(size, int) else size
    return least <= value <= most


# ------------------------------------------------------------------------------------------------------- keys


@fast
@given(S.keys())
def test_a_drawn_key_is_one_int64_pair_of_32_bit_words_the_samplers_take(key: torch.Tensor) -> None:
    assert key.shape == (2,) and key.dtype == torch.int64
    assert all(0 <= word < 2**32 for word in key.tolist())
    assert R.from_host(R.to_host(key)).equal(key)
    draws = R.uniform(key, 16)
    assert ((draws >= 0) & (draws < 1)).all()


def test_keys_shrink_to_the_root_of_seed_zero_and_vary_otherwise() -> None:
    assert find(S.keys(), lambda key: True, settings=SEARCH).equal(R.key(0))
    pair = find(st.tuples(S.keys(), S.keys()), lambda p: not p[0].equal(p[1]), settings=SEARCH)
    assert not pair[0].equal(pair[1])


# ----------------------------------------------------------------------------------------------------- images


@fast
@given(st.data())
def test_images_have_the_dtype_shape_range_and_memory_format_asked_for(data: st.DataObject) -> None:
    dtypes = data.draw(st.lists(st.sampled_from(IMAGE_DTYPES), min_size=1, max_size=4, unique=True))
    formats = data.draw(st.lists(st.sampled_from(FORMATS), min_size=1, max_size=2, unique=True))
    batch_size, channels, height, width = (data.draw(sizes(1, 6)) for _ in range(4))
    low = data.draw(st.floats(-4.0, 4.0))
    high = low + data.draw(st.floats(0.1, 4.0))
    images = data.draw(
        S.image_batches(
            dtypes=dtypes,
            memory_formats=formats,
            batch_size=batch_size,
            channels=channels,
            height=height,
            width=width,
            low=low,
            high=high,
        )
    )
    assert isinstance(images, torch.Tensor) and images.dtype in dtypes and images.dim() == 4
    for size, asked in zip(images.shape, (batch_size, channels, height, width), strict=True):
        assert within(size, asked), (tuple(images.shape), asked)
    assert any(images.is_contiguous(memory_format=memory_format) for memory_format in formats)
    if images.is_floating_point():
        values = images.to(torch.float64)
        assert values.isfinite().all()
        assert low <= values.min().item() and values.max().item() <= high, (
            low,
            high,
            values.min(),
            values.max(),
        )


def test_channels_last_batches_are_channels_last_and_not_contiguous() -> None:
    strategy = S.image_batches(memory_formats=[torch.channels_last], channels=3, height=4, width=4)
    images = find(strategy, lambda images: True, settings=SEARCH)
    assert images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_values_rounded_to_a_narrow_dtype_stay_within_an_awkward_range(dtype: torch.dtype) -> None:
    # 0.1 and 0.2 are not exact in any of these dtypes; the nearest values lie outside [0.1, 0.2].
    strategy = S.image_batches(dtypes=[dtype], low=0.1, high=0.2, height=4, width=4)

    @fast
    @given(strategy)
    def check(images: torch.Tensor) -> None:
        values = images.to(torch.float64)
        assert 0.1 <= values.min().item() and values.max().item() <= 0.2

    check()


def test_the_ends_of_the_range_and_constant_images_turn_up() -> None:
    def hits_both_ends(images: torch.Tensor) -> bool:
        return bool((images == -1).any() and (images == 2).any())

    assert hits_both_ends(find(S.image_batches(low=-1.0, high=2.0), hits_both_ends, settings=SEARCH))
    uint8 = find(S.image_batches(dtypes=[torch.uint8]), lambda x: bool((x == 255).any()), settings=SEARCH)
    assert uint8.dtype == torch.uint8
    constant = find(
        S.image_batches(height=4, width=4), lambda x: bool((x == x.flatten()[0]).all()), settings=SEARCH
    )
    assert constant.numel() >= 16


@fast
@given(st.data())
def test_targets_are_class_indices_one_per_image(data: st.DataObject) -> None:
    num_classes = data.draw(st.integers(1, 1000))
    images, targets = data.draw(S.image_batches(num_classes=num_classes, dtypes=[torch.uint8]))
    assert targets.dtype == torch.int64 and targets.shape == (images.shape[0],)
    assert 0 <= targets.min().item() and targets.max().item() < num_classes


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"dtypes": [torch.int32]}, "dtypes="),
        ({"dtypes": []}, "dtypes="),
        ({"memory_formats": [torch.preserve_format]}, "memory_formats="),
        ({"batch_size": 0}, "batch_size=0"),
        ({"channels": (3, 2)}, r"channels=\(3, 2\)"),
        ({"height": (1,)}, r"height=\(1,\)"),
        ({"width": 1.5}, "width=1.5"),
        ({"low": math.nan}, "low=nan"),
        ({"high": math.inf}, "high=inf"),
        ({"low": 2.0, "high": 1.0}, "low=2.0"),
        ({"dtypes": [torch.float16], "low": 0.1, "high": 0.1}, "low=0.1"),
        ({"num_classes": 0}, "num_classes=0"),
    ],
)
def test_bad_image_arguments_are_refused_by_name(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        S.image_batches(**arguments)


# ----------------------------------------------------------------------------------------------------- tokens


@fast
@given(st.data())
def test_token_targets_are_the_next_tokens(data: st.DataObject) -> None:
    vocab_size = data.draw(st.integers(1, 50))
    batch_size, length = data.draw(sizes(1, 6)), data.draw(sizes(1, 40))
    tokens, targets = data.draw(S.token_batches(vocab_size=vocab_size, batch_size=batch_size, length=length))
    assert (
        tokens.dtype == targets.dtype == torch.int64 and tokens.shape == targets.shape and tokens.dim() == 2
    )
    assert within(tokens.shape[0], batch_size) and within(tokens.shape[1], length)
    assert 0 <= min(tokens.min().item(), targets.min().item())
    assert max(tokens.max().item(), targets.max().item()) < vocab_size
    assert targets[:, :-1].equal(tokens[:, 1:])


@fast
@given(st.data())
def test_padding_ends_each_row_and_its_targets_are_ignored(data: st.DataObject) -> None:
    vocab_size = data.draw(st.integers(2, 50))
    padding_id = data.draw(st.integers(0, vocab_size - 1))
    tokens, targets = data.draw(S.token_batches(vocab_size=vocab_size, padding_id=padding_id, length=(1, 12)))
    padded = tokens == padding_id
    assert not padded[:, 0].any(), "every row starts with a token"
    assert padded.int().diff(dim=1).ge(0).all(), "padding only follows the tokens"
    follows = torch.cat([tokens[:, 1:], targets[:, -1:]], dim=1)
    assert (targets != padding_id).all()
    assert targets[:, :-1].equal(torch.where(padded[:, 1:], -100, tokens[:, 1:]))
    assert ((targets == -100) | ((follows >= 0) & (follows < vocab_size))).all()
    assert (targets[padded] == -100).all()


def test_padded_and_full_rows_both_turn_up() -> None:
    strategy = S.token_batches(padding_id=0, length=4)
    assert (find(strategy, lambda batch: bool((batch[0] == 0).any()), settings=SEARCH)[0] == 0).any()
    assert (find(strategy, lambda batch: bool((batch[1] != -100).all()), settings=SEARCH)[1] != -100).all()


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"vocab_size": 0}, "vocab_size=0"),
        ({"vocab_size": 2**25}, "vocab_size=33554432"),
        ({"length": 0}, "length=0"),
        ({"batch_size": (2, 1)}, r"batch_size=\(2, 1\)"),
        ({"vocab_size": 16, "padding_id": 16}, "padding_id=16"),
        ({"vocab_size": 1, "padding_id": 0}, "vocab_size=1"),
    ],
)
def test_bad_token_arguments_are_refused_by_name(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        S.token_batches(**arguments)


# ------------------------------------------------------------------------------------------------------- time


def inconsistencies(t: Timestamp) -> list[str]:
    """Returns what in ``t`` the trainer's runs never show: epochs of one length (each of at least one batch),
    batches of at least one sample, no tokens or at least one per sample, and wall-clock times in order."""
    found = []
    earlier = {
        unit: getattr(t, unit) - getattr(t, f"{unit}_in_epoch") for unit in ("batch", "sample", "token")
    }
    if any(value < 0 for value in earlier.values()):
        found.append("an in-epoch counter exceeds its total")
    if t.epoch == 0 and any(earlier.values()):
        found.append("epoch 0 with work from an earlier epoch")
    if earlier["batch"] < t.epoch:
        found.append("an epoch without batches")
    if t.epoch and (earlier["batch"] % t.epoch or t.batch_in_epoch > earlier["batch"] // t.epoch):
        found.append("epochs of different lengths")
    if t.sample_in_epoch < t.batch_in_epoch or earlier["sample"] < earlier["batch"]:
        found.append("a batch without samples")
    for tokens, samples in ((t.token_in_epoch, t.sample_in_epoch), (earlier["token"], earlier["sample"])):
        if tokens and tokens < samples:
            found.append("tokens counted for some samples only")
    if bool(t.token_in_epoch) != bool(t.token) and t.sample_in_epoch:
        found.append("tokens counted in one epoch and not in another")
    if not t.total_wct >= t.epoch_wct >= t.batch_wct >= 0:
        found.append("wall-clock times out of order")
    if t.batch_in_epoch == 0 and (t.epoch_wct or t.batch_wct):
        found.append("time spent in an epoch without batches")
    if t.iteration != 0 or t.epoch_in_iteration != t.epoch:
        found.append("iterations the trainer does not count")
    if (
        t.max_duration is not None
        and t.max_duration.unit is TimeUnit.BATCH
        and t.batch > t.max_duration.value
    ):
        found.append("batches beyond the end of the run")
    return found


@pytest.mark.parametrize(("max_steps", "steps_per_epoch"), [(1, 1), (3, 1), (7, 3), (6, 2)])
def test_the_consistency_check_passes_every_timestamp_of_the_trainers_schedule(
    max_steps: int, steps_per_epoch: int
) -> None:
    ticks = run_schedule(max_steps, steps_per_epoch)
    reply = None
    while (tick := next_tick(ticks, reply)) is not None:
        what, timestamp = tick
        reply = Progress(4, 32, 0.5) if what is Action.STEP else None
        assert inconsistencies(timestamp) == [], (what, timestamp)


def test_the_consistency_check_can_tell() -> None:
    assert inconsistencies(Timestamp(epoch=1, batch=2, batch_in_epoch=3, sample=3, sample_in_epoch=3)) != []
    assert inconsistencies(Timestamp(epoch=0, batch=2, sample=2, batch_in_epoch=1, sample_in_epoch=1)) != []
    assert inconsistencies(Timestamp().advance(2).advance(1).next_epoch().advance(4, duration=1.0)) == []
    assert inconsistencies(Timestamp().advance(2).next_epoch().advance(1).advance(1).advance(1)) != []


@fast
@given(S.timestamps())
def test_a_drawn_timestamp_is_consistent_and_stays_so_as_training_goes_on(t: Timestamp) -> None:
    assert inconsistencies(t) == []
    steps_per_epoch = (t.batch - t.batch_in_epoch) // t.epoch if t.epoch else None
    tokens = 7 if t.token else 0
    if steps_per_epoch is None or t.batch_in_epoch < steps_per_epoch:
        assert inconsistencies(dataclasses.replace(t.advance(3, tokens, 0.5), max_duration=None)) == []
    if t.batch_in_epoch and (steps_per_epoch is None or t.batch_in_epoch == steps_per_epoch):
        assert inconsistencies(t.next_epoch(1.0)) == []
    assert Timestamp.from_dict(t.to_dict()) == dataclasses.replace(t, max_duration=None)


@fast
@given(st.data())
def test_timestamps_keep_to_their_bounds_and_max_duration(data: st.DataObject) -> None:
    max_epoch, max_batch = data.draw(st.integers(0, 5)), data.draw(st.integers(0, 50))
    with_duration = data.draw(st.sampled_from([True, False, None]))
    units = data.draw(st.lists(st.sampled_from(["ep", "ba", "sp", "tok"]), min_size=1, unique=True))
    strategy = S.timestamps(
        max_epoch=max_epoch, max_batch=max_batch, max_duration=with_duration, duration_units=units
    )
    t = data.draw(strategy)
    assert t.epoch <= max_epoch and t.batch <= max_batch
    if with_duration is not None:
        assert (t.max_duration is not None) == with_duration
    if t.max_duration is not None:
        assert t.max_duration.unit.value in units and t.max_duration.value >= 1
        assert t.get(t.max_duration.unit) <= t.max_duration.value
        assert 0.0 <= t.elapsed <= 1.0
        assert (t >= "0.5dur") == (t.elapsed >= 0.5)


def test_timestamps_reach_later_epochs_and_the_end_of_the_run() -> None:
    late = find(S.timestamps(), lambda t: t.epoch >= 3 and t.batch_in_epoch > 0, settings=SEARCH)
    assert late.batch > late.batch_in_epoch
    assert find(S.timestamps(max_duration=True), lambda t: t.elapsed == 1.0, settings=SEARCH).elapsed == 1.0
    assert find(S.timestamps(max_duration=True), lambda t: 0 < t.elapsed < 1, settings=SEARCH).elapsed < 1


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"max_epoch": -1}, "max_epoch=-1"),
        ({"max_batch": 1.5}, "max_batch=1.5"),
        ({"max_duration": 1}, "max_duration=1"),
        ({"duration_units": ["dur"]}, r"duration_units=\['dur'\]"),
        ({"duration_units": []}, r"duration_units=\[\]"),
    ],
)
def test_bad_timestamp_arguments_are_refused_by_name(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        S.timestamps(**arguments)


@fast
@given(st.data())
def test_time_strings_parse_in_the_units_and_bounds_asked_for_and_round_trip(data: st.DataObject) -> None:
    units = data.draw(st.lists(st.sampled_from(list(TimeUnit)), min_size=1, unique=True))
    max_count, max_fraction = data.draw(st.integers(0, 10**9)), data.draw(st.floats(0.0, 10.0))
    text = data.draw(S.time_strings(units=units, max_count=max_count, max_fraction=max_fraction))
    time = Time.from_timestring(text)
    assert time.unit in units
    assert 0 <= time.value <= (max_fraction if time.unit is TimeUnit.DURATION else max_count)
    assert Time.from_timestring(time.to_timestring()) == time
    assert Time.from_input(text, TimeUnit.EPOCH) == time


def test_time_strings_take_suffixes_as_strings_and_shrink_to_the_written_form() -> None:
    assert (
        find(S.time_strings(units=["ba"]), lambda s: Time.from_timestring(s).value >= 120, settings=SEARCH)
        == "120ba"
    )
    assert find(S.time_strings(units=[TimeUnit.DURATION]), lambda s: True, settings=SEARCH) == "0.0dur"


@pytest.mark.parametrize(
    ("units", "written"),
    [
        (["tok"], lambda s: "e" in s.lower().removesuffix("tok")),
        (["sp"], lambda s: ".0" in s),
        (["dur"], lambda s: s.endswith("DUR")),
        (
            ["sec"],
            lambda s: s.endswith("m") or s.endswith("h") or s[-1] == "s" and not s.lower().endswith("sec"),
        ),
    ],
    ids=["scientific", "float", "upper case", "wall clock"],
)
def test_every_written_form_turns_up(units: list[str], written: Any) -> None:
    text = find(S.time_strings(units=units), written, settings=SEARCH)
    Time.from_timestring(text)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"units": []}, r"units=\[\]"),
        ({"units": "ep"}, "units='ep'"),
        ({"units": ["days"]}, "units="),
        ({"max_count": -1}, "max_count=-1"),
        ({"max_fraction": math.nan}, "max_fraction=nan"),
    ],
)
def test_bad_time_string_arguments_are_refused_by_name(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        S.time_strings(**arguments)


# ------------------------------------------------------------------------------------------- hyperparameters


@pytest.mark.parametrize("name", BUILTIN)
def test_drawn_hyperparameters_construct_every_built_in_algorithm(name: str) -> None:
    cls = REGISTRY[name]
    fields = [field.name for field in dataclasses.fields(cls) if field.init]

    @settings(max_examples=15, deadline=None)
    @given(S.hyperparameters(cls))
    def check(hparams: dict[str, Any]) -> None:
        assert list(hparams) == fields
        cls(**hparams)

    check()


# ``target_modules`` (name patterns of a surgery) is drawn at its default: a pattern must name a module of the model
# the surgery meets, which the record alone cannot know.
@pytest.mark.parametrize(
    "name", [name for name in BUILTIN if {f.name for f in dataclasses.fields(REGISTRY[name])} - {"target_modules"}]
)
def test_drawn_hyperparameters_go_beyond_the_defaults(name: str) -> None:
    cls = REGISTRY[name]
    found = find(S.hyperparameters(cls), lambda hparams: cls(**hparams) != cls(), settings=SEARCH)
    assert cls(**found) != cls()


def test_string_fields_take_the_values_their_module_accepts() -> None:
    from composer_fn.algorithms import AugMix, GradientClipping, StochasticDepth

    for cls, field, value in (
        (GradientClipping, "clipping_type", "adaptive"),
        (AugMix, "augmentation_set", "safe"),
        (StochasticDepth, "target_layer_name", "BasicBlock"),
    ):
        assert (
            find(S.hyperparameters(cls), lambda h, f=field, v=value: h[f] == v, settings=SEARCH)[field]
            == value
        )


@dataclass(frozen=True)
class Window(Algorithm):
    """A record of the user's own with a cross-field rule, a required flag, a Literal and a required count."""

    enabled: bool
    side: Literal["left", "right"]
    size: int
    start: float = 0.2
    end: float = 0.8
    every: str = "2ba"

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end <= 1:
            raise ValueError(f"start={self.start!r}, end={self.end!r}: expected 0 <= start < end <= 1")
        if self.size < 1:
            raise ValueError(f"size={self.size!r} must be >= 1")
        if Time.from_timestring(self.every).unit is not TimeUnit.BATCH:
            raise ValueError(f"every={self.every!r} must be in ba")


@fast
@given(S.hyperparameters(Window, size=st.integers(1, 3)))
def test_a_users_record_gets_valid_values_and_keeps_the_given_strategies(hparams: dict[str, Any]) -> None:
    window = Window(**hparams)
    assert 1 <= window.size <= 3 and window.side in ("left", "right") and isinstance(window.enabled, bool)


def test_a_users_record_gets_values_that_satisfy_its_rule_together() -> None:
    strategy = S.hyperparameters(Window, size=st.just(1))
    found = find(
        strategy, lambda h: h["start"] != 0.2 and h["end"] != 0.8 and h["every"] != "2ba", settings=SEARCH
    )
    assert found["start"] < found["end"] and found["every"].endswith("ba")


def test_given_values_the_record_refuses_are_not_replaced() -> None:
    @settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
    @given(S.hyperparameters(Window, size=st.just(0)))
    def check(hparams: dict[str, Any]) -> None:
        raise AssertionError(f"drew {hparams} with a size the record refuses")

    with pytest.raises(Unsatisfiable):
        check()


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: S.hyperparameters(int), "algorithm_class=<class 'int'>"),
        (lambda: S.hyperparameters(Algorithm()), "algorithm_class=Algorithm"),
        (lambda: S.hyperparameters(Window), r"Window.size has no default"),
        (lambda: S.hyperparameters(Window, size=3), "size=3 must be a hypothesis strategy"),
        (lambda: S.hyperparameters(Window, width=st.just(1)), "width=just"),
    ],
    ids=["not a class", "an instance", "no default", "not a strategy", "no such field"],
)
def test_bad_hyperparameter_arguments_are_refused_by_name(call: Any, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        call()


@fast
@given(S.algorithms())
def test_a_drawn_algorithm_is_a_built_in_record_whose_config_rebuilds_it(algorithm: Algorithm) -> None:
    assert algorithm.name in BUILTIN and type(algorithm) is REGISTRY[algorithm.name]
    assert algorithm_from_config(json.loads(json.dumps(algorithm.to_config()))) == algorithm


@fast
@given(S.algorithms(modality="tokens"), S.algorithms(names=["mixup", "cutout"]))
def test_algorithms_keep_to_the_names_and_modality_asked_for(
    token_algorithm: Algorithm, picked: Algorithm
) -> None:
    assert settings_for(token_algorithm).modality == "tokens"
    assert picked.name in ("mixup", "cutout")


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"names": ["no_such_algorithm"]}, "names="),
        ({"names": "mixup"}, "names='mixup'"),
        ({"modality": "audio"}, "modality='audio'"),
        ({"names": ["alibi"], "modality": "image"}, "names="),
    ],
)
def test_bad_algorithm_arguments_are_refused_by_name(arguments: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        S.algorithms(**arguments)


# ----------------------------------------------------------------------------------------------------- import


def test_the_testing_package_imports_without_hypothesis_and_the_strategies_say_how_to_get_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['hypothesis'] = None\n"
        "import composer_fn.testing as testing\n"
        "assert testing.CHECKS\n"
        "try:\n"
        "    from composer_fn.testing import strategies\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert "pip install hypothesis" in finished.stdout
