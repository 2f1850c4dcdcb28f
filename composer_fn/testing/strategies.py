"""Hypothesis strategies for property-testing algorithms: keys, batches, training time and hyperparameters.

Each function validates its arguments when called (a ``ValueError`` names the argument, the value and what is
accepted) and returns a ``SearchStrategy`` to hand to ``@given``. A tensor holds one drawn value or values
from a drawn key (the project's own samplers, so a batch of any size costs one draw), and failures shrink to
the constant tensor; a few entries are then drawn one by one, so that the ends of the range turn up.

Hypothesis is a development dependency: ``pip install hypothesis`` (or ``pip install -e '.[dev]'``).

Longer than most modules: one public strategy a kind of value, each with the argument checks and the drawing
helpers it needs, kept in one place so that a user reads the whole kit in one file.
"""

from __future__ import annotations

try:
    import hypothesis.strategies as st
    from hypothesis import reject
    from hypothesis.strategies import DrawFn, SearchStrategy
except ImportError as error:
    raise ImportError(
        "composer_fn.testing.strategies needs hypothesis, a development dependency: "
        "pip install hypothesis (or, in the composer_fn checkout, pip install -e '.[dev]')"
    ) from error

import dataclasses
import enum
import functools
import math
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, overload

import torch
from torch import Tensor

from composer_fn import algorithms as _builtin_algorithms
from composer_fn.core import random as R
from composer_fn.core.algorithm import REGISTRY, Algorithm
from composer_fn.core.random import Key
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.core.validate import is_integer, is_real
from composer_fn.models.bert import IGNORE_INDEX
from composer_fn.testing.contract import IMAGE_DTYPES
from composer_fn.testing.settings import MODALITIES, settings_for

__all__ = [
    "keys",
    "image_batches",
    "token_batches",
    "timestamps",
    "time_strings",
    "hyperparameters",
    "algorithms",
]

Size = int | tuple[int, int]
"""A size: exactly this many, or a pair ``(least, most)``."""

_MAX_SEED = 2**64 - 1
_MAX_WORD = 2**32 - 1
_MAX_RANDINT_SPAN = 2**24
_PINNED = 4
_COUNTED_UNITS = (TimeUnit.EPOCH, TimeUnit.BATCH, TimeUnit.SAMPLE, TimeUnit.TOKEN)
_EXACT_FLOAT_COUNTS = 2**53
_SECONDS = st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False)
_MEMORY_FORMATS = (torch.contiguous_format, torch.channels_last)
_UNSHOWN = object()


def _size(argument: str, value: object) -> tuple[int, int]:
    if is_integer(value) and value >= 1:
        return value, value
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(is_integer(v) and v >= 1 for v in value)
        and value[0] <= value[1]
    ):
        return int(value[0]), int(value[1])
    raise ValueError(
        f"{argument}={value!r} must be an int >= 1 or a pair (least, most) of such ints with least <= most"
    )


def _count(argument: str, value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    if is_integer(value) and value >= minimum and (maximum is None or value <= maximum):
        return value
    bounds = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
    raise ValueError(f"{argument}={value!r} must be an int {bounds}")


def _members(argument: str, value: object, accepted: Sequence[Any], names: str) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"{argument}={value!r} must be a non-empty sequence of {names}")
    for member in value:
        if not any(member is a for a in accepted):
            raise ValueError(
                f"{argument}={value!r} holds {member!r}; expected a non-empty sequence of {names}"
            )
    return tuple(dict.fromkeys(value))


def _flag_or_either(argument: str, value: object) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ValueError(f"{argument}={value!r} must be True, False or None (either)")


def keys() -> SearchStrategy[Key]:
    """Returns a strategy for keys as the project makes them: ``R.key(seed)``, maybe folded with integers.

    The seed is any int ``R.key`` accepts, in ``[0, 2**64)``; up to two ``R.fold_in`` of 32-bit integers
    follow, as a step's key (``fold_in(root, step)``) and an algorithm's key (``algorithm_key(key, name)``)
    are made. Each key is an ``int64`` tensor of shape ``[2]`` on the CPU; failures shrink to ``R.key(0)``.
    """
    return _keys()


@st.composite
def _keys(draw: DrawFn) -> Key:
    key = R.key(draw(st.integers(0, _MAX_SEED)))
    for data in draw(st.lists(st.integers(0, _MAX_WORD), max_size=2)):
        key = R.fold_in(key, data)
    return key


def _filled(
    draw: DrawFn,
    numel: int,
    least: float,
    greatest: float,
    keyed: Callable[[Key, int], Tensor],
    dtype: torch.dtype,
) -> Tensor:
    # A quarter of the tensors hold one drawn value, the rest values from a drawn key; either costs two
    # choices, so failures shrink to the constant tensor. A few entries are then drawn one by one, half of
    # them at an end of the range, where a bounded draw rarely lands.
    if dtype.is_floating_point:
        between: SearchStrategy[Any] = st.floats(least, greatest, allow_nan=False, allow_infinity=False)
    else:
        between = st.integers(int(least), int(greatest))
    if draw(st.integers(0, 3)) == 0:
        flat = torch.full((numel,), draw(between), dtype=dtype)
    else:
        flat = keyed(R.key(draw(st.integers(0, _MAX_WORD))), numel).to(dtype)
    ends = st.sampled_from((least, greatest) if dtype.is_floating_point else (int(least), int(greatest)))
    entries = st.tuples(st.integers(0, numel - 1), st.one_of(ends, between))
    for index, value in draw(st.lists(entries, max_size=min(numel, _PINNED))):
        flat[index] = value
    return flat


def _representable_range(dtype: torch.dtype, low: float, high: float) -> tuple[float, float] | None:
    # The least and greatest values of ``dtype`` within [low, high], or None when it holds none: values drawn
    # between them and rounded to ``dtype`` stay within [low, high], since rounding is monotone.
    info = torch.finfo(dtype)
    low, high = max(low, float(info.min)), min(high, float(info.max))
    if low > high:
        return None
    least = torch.tensor(low, dtype=torch.float64).to(dtype)
    if float(least) < low:
        least = torch.nextafter(least, torch.tensor(math.inf, dtype=dtype))
    greatest = torch.tensor(high, dtype=torch.float64).to(dtype)
    if float(greatest) > high:
        greatest = torch.nextafter(greatest, torch.tensor(-math.inf, dtype=dtype))
    return (float(least), float(greatest)) if float(least) <= float(greatest) else None


@overload
def image_batches(
    *,
    dtypes: Sequence[torch.dtype] = ...,
    batch_size: Size = ...,
    channels: Size = ...,
    height: Size = ...,
    width: Size = ...,
    low: float = ...,
    high: float = ...,
    memory_formats: Sequence[torch.memory_format] = ...,
    num_classes: None = None,
) -> SearchStrategy[Tensor]: ...


@overload
def image_batches(
    *,
    dtypes: Sequence[torch.dtype] = ...,
    batch_size: Size = ...,
    channels: Size = ...,
    height: Size = ...,
    width: Size = ...,
    low: float = ...,
    high: float = ...,
    memory_formats: Sequence[torch.memory_format] = ...,
    num_classes: int,
) -> SearchStrategy[tuple[Tensor, Tensor]]: ...


def image_batches(
    *,
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    batch_size: Size = (1, 4),
    channels: Size = (1, 4),
    height: Size = (1, 16),
    width: Size = (1, 16),
    low: float = 0.0,
    high: float = 1.0,
    memory_formats: Sequence[torch.memory_format] = (torch.contiguous_format,),
    num_classes: int | None = None,
) -> SearchStrategy[Any]:
    """Returns a strategy for image batches ``[B, C, H, W]``, or ``(images, targets)`` with ``num_classes``.

    Each batch has one of ``dtypes`` (float32, float16, bfloat16, uint8) and one of ``memory_formats``
    (``torch.contiguous_format``, ``torch.channels_last``), and sizes within ``batch_size``, ``channels``,
    ``height`` and ``width`` (an int, or a pair ``(least, most)``). Floating-point values lie in
    ``[low, high]`` (pixels before normalisation by default) and are exact in their dtype; uint8 values
    take all of ``[0, 255]``. With ``num_classes``, targets are ``int64 [B]`` class indices in
    ``[0, num_classes)``.
    """
    chosen_dtypes = _members(
        "dtypes", dtypes, IMAGE_DTYPES, "torch.uint8, torch.float16, torch.bfloat16, torch.float32"
    )
    formats = _members(
        "memory_formats", memory_formats, _MEMORY_FORMATS, "torch.contiguous_format, torch.channels_last"
    )
    sizes = tuple(
        _size(argument, value)
        for argument, value in (
            ("batch_size", batch_size),
            ("channels", channels),
            ("height", height),
            ("width", width),
        )
    )
    for argument, bound in (("low", low), ("high", high)):
        if not is_real(bound) or not math.isfinite(bound):
            raise ValueError(f"{argument}={bound!r} must be a finite number")
    if low > high:
        raise ValueError(f"low={low!r} and high={high!r}: expected low <= high")
    ranges: dict[torch.dtype, tuple[float, float]] = {}
    for dtype in chosen_dtypes:
        if dtype == torch.uint8:
            ranges[dtype] = (0.0, 255.0)
            continue
        found = _representable_range(dtype, float(low), float(high))
        if found is None:
            raise ValueError(
                f"low={low!r}, high={high!r} hold no {dtype} value; "
                "expected a range that holds one, or other dtypes"
            )
        ranges[dtype] = found
    if num_classes is not None:
        _count("num_classes", num_classes, minimum=1, maximum=_MAX_RANDINT_SPAN)
    return _image_batches(chosen_dtypes, formats, sizes, ranges, num_classes)


@st.composite
def _image_batches(
    draw: DrawFn,
    dtypes: tuple[torch.dtype, ...],
    formats: tuple[torch.memory_format, ...],
    sizes: tuple[tuple[int, int], ...],
    ranges: Mapping[torch.dtype, tuple[float, float]],
    num_classes: int | None,
) -> Tensor | tuple[Tensor, Tensor]:
    dtype = draw(st.sampled_from(dtypes))
    memory_format = draw(st.sampled_from(formats))
    shape = tuple(draw(st.integers(least, most)) for least, most in sizes)
    numel = math.prod(shape)
    least, greatest = ranges[dtype]
    if dtype == torch.uint8:
        flat = _filled(draw, numel, 0, 255, lambda k, n: R.randint(k, 0, 256, n), torch.int64)
    else:
        flat = _filled(
            draw,
            numel,
            least,
            greatest,
            lambda k, n: R.uniform(k, n, dtype=torch.float64) * (greatest - least) + least,
            torch.float64,
        )
        flat = flat.clamp(least, greatest)
    images = flat.reshape(shape).to(dtype).contiguous(memory_format=memory_format)
    if num_classes is None:
        return images
    targets = _filled(
        draw, shape[0], 0, num_classes - 1, lambda k, n: R.randint(k, 0, num_classes, n), torch.int64
    )
    return images, targets


def token_batches(
    *,
    vocab_size: int = 16,
    batch_size: Size = (1, 4),
    length: Size = (1, 32),
    padding_id: int | None = None,
) -> SearchStrategy[tuple[Tensor, Tensor]]:
    """Returns a strategy for ``(tokens, targets)``: ``int64 [B, S]`` token ids and their next-token labels.

    Each row is a sequence of ``S + 1`` ids in ``[0, vocab_size)``: the tokens are its first ``S``, the
    targets its last ``S`` (at each position, the id that follows), as ``causal_lm_loss`` reads them. With
    ``padding_id``, each row's sequence stops after a drawn number of ids (at least one token) and the rest
    is ``padding_id``, which no other position holds; a target whose next position is padding is ``-100``,
    the label the losses skip. Sizes are an int or a pair ``(least, most)``.
    """
    _count("vocab_size", vocab_size, minimum=1, maximum=_MAX_RANDINT_SPAN)
    sizes = (_size("batch_size", batch_size), _size("length", length))
    if padding_id is not None:
        _count("padding_id", padding_id, minimum=0, maximum=vocab_size - 1)
        if vocab_size < 2:
            raise ValueError(
                f"vocab_size={vocab_size!r} with padding_id={padding_id!r}: expected vocab_size >= 2, "
                "so that tokens other than the padding exist"
            )
    return _token_batches(vocab_size, sizes, padding_id)


@st.composite
def _token_batches(
    draw: DrawFn, vocab_size: int, sizes: tuple[tuple[int, int], tuple[int, int]], padding_id: int | None
) -> tuple[Tensor, Tensor]:
    batch, length = (draw(st.integers(least, most)) for least, most in sizes)
    symbols = vocab_size if padding_id is None else vocab_size - 1
    ids = _filled(
        draw,
        batch * (length + 1),
        0,
        symbols - 1,
        lambda k, n: R.randint(k, 0, symbols, n),
        torch.int64,
    )
    rows = ids.reshape(batch, length + 1)
    if padding_id is None:
        return rows[:, :-1].clone(), rows[:, 1:].clone()
    # Ids at or above the padding id move up one, so that only padding holds it.
    rows = rows + (rows >= padding_id).to(torch.int64)
    padding = draw(st.lists(st.integers(0, length), min_size=batch, max_size=batch))
    ends = torch.tensor([length + 1 - p for p in padding], dtype=torch.int64)
    padded = torch.arange(length + 1) >= ends[:, None]
    tokens = torch.where(padded, padding_id, rows)[:, :-1].clone()
    targets = torch.where(padded, IGNORE_INDEX, rows)[:, 1:].clone()
    return tokens, targets


def timestamps(
    *,
    max_epoch: int = 100,
    max_batch: int = 100_000,
    max_duration: bool | None = None,
    duration_units: Sequence[TimeUnit | str] = ("ba",),
) -> SearchStrategy[Timestamp]:
    """Returns a strategy for timestamps as the trainer counts a run with ``advance`` and ``next_epoch``.

    Epochs have one drawn length in batches; up to ``max_epoch`` of them are done and up to ``max_batch``
    batches, the current epoch holding between none and all of its batches (all of them at ``EPOCH_END``).
    Every batch holds at least one sample, and a run counts no tokens or at least one per sample. The
    in-epoch counters are the current epoch's share of the totals, ``total_wct >= epoch_wct >= batch_wct
    >= 0`` (the last two zero before the epoch's first batch), and ``iteration`` stays 0. With
    ``max_duration`` (True, False, or None for either), the run lasts a drawn length in one of
    ``duration_units`` (ep, ba, sp or tok; batches by default, as the trainer sets it), no less than what
    is done, so that ``elapsed`` (in [0, 1]) and comparisons with ``'0.5dur'`` are defined.
    """
    _count("max_epoch", max_epoch)
    _count("max_batch", max_batch)
    with_duration = _flag_or_either("max_duration", max_duration)
    units = _units("duration_units", duration_units)
    if not set(units) <= set(_COUNTED_UNITS):
        raise ValueError(f"duration_units={duration_units!r} must hold only ep, ba, sp or tok")
    return _timestamps(max_epoch, max_batch, with_duration, units)


@st.composite
def _timestamps(
    draw: DrawFn, max_epoch: int, max_batch: int, max_duration: bool | None, units: tuple[TimeUnit, ...]
) -> Timestamp:
    steps_per_epoch = draw(st.integers(1, max(max_batch, 1)))
    epoch = draw(st.integers(0, min(max_epoch, max_batch // steps_per_epoch)))
    batch_in_epoch = draw(st.integers(0, min(steps_per_epoch, max_batch - epoch * steps_per_epoch)))
    batch = epoch * steps_per_epoch + batch_in_epoch
    samples_per_batch = draw(st.integers(1, 1024))
    tokens_per_sample = draw(st.integers(0, 2048))

    def counted(batches: int) -> tuple[int, int]:
        samples = draw(st.integers(batches, batches * samples_per_batch))
        tokens = draw(st.integers(samples, samples * tokens_per_sample)) if tokens_per_sample else 0
        return samples, tokens

    sample_in_epoch, token_in_epoch = counted(batch_in_epoch)
    earlier_samples, earlier_tokens = counted(batch - batch_in_epoch)
    batch_wct = draw(_SECONDS) if batch_in_epoch else 0.0
    epoch_wct = batch_wct + (draw(_SECONDS) if batch_in_epoch > 1 else 0.0)
    total_wct = epoch_wct + (draw(_SECONDS) if epoch else 0.0)
    timestamp = Timestamp(
        epoch=epoch,
        batch=batch,
        sample=earlier_samples + sample_in_epoch,
        token=earlier_tokens + token_in_epoch,
        epoch_in_iteration=epoch,
        batch_in_epoch=batch_in_epoch,
        sample_in_epoch=sample_in_epoch,
        token_in_epoch=token_in_epoch,
        total_wct=total_wct,
        epoch_wct=epoch_wct,
        batch_wct=batch_wct,
    )
    if max_duration is False or (max_duration is None and not draw(st.booleans())):
        return timestamp
    unit = draw(st.sampled_from(units))
    # An epoch under way counts as begun: the run lasts at least until it ends.
    done = epoch + (0 < batch_in_epoch < steps_per_epoch) if unit is TimeUnit.EPOCH else timestamp.get(unit)
    length = draw(st.integers(max(done, 1), 2 * done + 10))
    return timestamp.with_max_duration(Time(length, unit))


def _units(argument: str, value: object) -> tuple[TimeUnit, ...]:
    suffixes = ", ".join(unit.value for unit in TimeUnit)
    names = f"time units (TimeUnit members or their suffixes {suffixes})"
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"{argument}={value!r} must be a non-empty sequence of {names}")
    units = []
    for member in value:
        try:
            units.append(member if isinstance(member, TimeUnit) else TimeUnit(str(member).lower()))
        except ValueError:
            raise ValueError(
                f"{argument}={value!r} holds {member!r}; expected a non-empty sequence of {names}"
            ) from None
    return tuple(dict.fromkeys(units))


def time_strings(
    *,
    units: Sequence[TimeUnit | str] = ("ep", "ba", "sp", "tok", "dur"),
    max_count: int = 1_000_000,
    max_fraction: float = 1.0,
) -> SearchStrategy[str]:
    """Returns a strategy for time strings such as ``'3ep'``, ``'120BA'``, ``'0.5dur'`` or ``'2048tok'``.

    Every string is one ``Time.from_timestring`` accepts, in one of ``units`` (TimeUnit members or their
    suffixes; ``iter`` and ``sec`` on request): whole counts up to ``max_count`` written as ``'120ba'``,
    ``'120.0ba'`` or ``'12e1ba'``, fractions of the run in ``[0, max_fraction]`` as ``repr`` writes them,
    seconds also as ``'1h30m5s'``, the suffix in lower or upper case. Failures shrink to the form
    ``to_timestring`` writes.
    """
    chosen = _units("units", units)
    _count("max_count", max_count)
    if not is_real(max_fraction) or not math.isfinite(max_fraction) or max_fraction < 0:
        raise ValueError(f"max_fraction={max_fraction!r} must be a finite number >= 0")
    return _time_strings(chosen, max_count, float(max_fraction))


def _count_forms(value: int) -> list[str]:
    forms = [str(value)]
    if value <= _EXACT_FLOAT_COUNTS:
        forms.append(f"{value}.0")
        if value and value % 10 == 0:
            digits = str(value).rstrip("0")
            forms.append(f"{digits}e{len(str(value)) - len(digits)}")
    return forms


def _wall_clock(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, rest = divmod(rest, 60)
    parts = [f"{count}{letter}" for count, letter in ((hours, "h"), (minutes, "m"), (rest, "s")) if count]
    return "".join(parts) or "0s"


@st.composite
def _time_strings(draw: DrawFn, units: tuple[TimeUnit, ...], max_count: int, max_fraction: float) -> str:
    unit = draw(st.sampled_from(units))
    if unit is TimeUnit.DURATION:
        number = repr(draw(st.floats(0.0, max_fraction, allow_nan=False, allow_infinity=False)))
    else:
        count = draw(st.integers(0, max_count))
        if unit is TimeUnit.SECOND and draw(st.booleans()):
            return _wall_clock(count)
        number = draw(st.sampled_from(_count_forms(count)))
    return number + (unit.value.upper() if draw(st.booleans()) else unit.value)


def hyperparameters(
    algorithm_class: type[Algorithm], /, **fields: SearchStrategy[Any]
) -> SearchStrategy[dict[str, Any]]:
    """Returns a strategy for hyperparameters ``h`` such that ``algorithm_class(**h)`` constructs.

    Each field is drawn from its default, from the value the contract suite checks it with (its check
    settings' example), and from what its type and default suggest: booleans; a ``Literal``'s or an enum's
    members; ints in ``[min(d, 0), max(2·d, 8)]`` and floats in ``[0, max(2·d, 1)]`` around the default
    ``d`` (0 when it is None); for a time string default, its unit with counts up to twice it or fractions
    in [0, 1]; for another string, the other members of a module-level collection of strings holding the
    default (its accepted values) in the record's module or a helper module of its package that it
    imports. A batch key (``int | str``) and a field nothing is inferred for keep their default. Keyword
    arguments give a field's strategy instead, and those values are kept as drawn (a field without a
    default needs one unless it is a bool, Literal or enum). Drawn values the record refuses together give
    way to defaults, field by field, so every draw constructs.
    """
    if not (
        isinstance(algorithm_class, type)
        and issubclass(algorithm_class, Algorithm)
        and dataclasses.is_dataclass(algorithm_class)
    ):
        raise ValueError(
            f"algorithm_class={algorithm_class!r} must be an algorithm record (a dataclass subclass of "
            "Algorithm), e.g. composer_fn.algorithms.MixUp"
        )
    record = algorithm_class.__name__
    names = [field.name for field in dataclasses.fields(algorithm_class) if field.init]
    for name, given in fields.items():
        if name not in names:
            raise ValueError(
                f"{name}={given!r} is not a field of {record}; its fields: {', '.join(names) or 'none'}"
            )
        if not isinstance(given, SearchStrategy):
            raise ValueError(f"{name}={given!r} must be a hypothesis strategy (st.just(value) for one value)")
    hints = _type_hints(algorithm_class)
    example = _example(algorithm_class)
    defaults: dict[str, Callable[[], Any]] = {}
    free: dict[str, SearchStrategy[Any]] = {}
    kept: dict[str, SearchStrategy[Any]] = dict(fields)
    for field in dataclasses.fields(algorithm_class):
        if not field.init or field.name in fields:
            continue
        hint = hints.get(field.name, Any)
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = functools.partial(_constant, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory
        else:
            inferred = _without_default(hint)
            if inferred is None:
                raise ValueError(
                    f"{record}.{field.name} has no default and its type {hint!r} suggests no values: pass a "
                    f"strategy, e.g. hyperparameters({record}, {field.name}=st.integers(1, 8))"
                )
            kept[field.name] = inferred
            continue
        shown = getattr(example, field.name) if example is not None else _UNSHOWN
        free[field.name] = _field_values(algorithm_class, hint, defaults[field.name](), shown)
    return _hyperparameters(algorithm_class, names, defaults, free, kept)


def _field_values(cls: type, hint: Any, default: Any, shown: Any) -> SearchStrategy[Any]:
    # The default first, so that failures shrink to it.
    candidates = [default] if shown is _UNSHOWN or _same(shown, default) else [default, shown]
    suggested = _suggested(hint, default, cls)
    fixed = st.sampled_from(candidates)
    return fixed if suggested is None else st.one_of(fixed, suggested)


def _constant(value: Any) -> Any:
    return value


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: infer from the defaults instead
        return {}


def _example(cls: type[Algorithm]) -> Algorithm | None:
    name = next((name for name, registered in REGISTRY.items() if registered is cls), None)
    if name is None:
        return None
    example = settings_for(name).example
    return example if isinstance(example, cls) else None


def _without_default(hint: Any) -> SearchStrategy[Any] | None:
    if hint is bool:
        return st.booleans()
    if typing.get_origin(hint) is Literal:
        return st.sampled_from(typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    return None


def _suggested(hint: Any, default: Any, cls: type) -> SearchStrategy[Any] | None:
    # What the field's type and default suggest besides the default itself; None when nothing does.
    if hint is Any and default is not None:
        hint = type(default)
    fixed = _without_default(hint)
    if fixed is not None:
        return fixed
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [member for member in typing.get_args(hint) if member is not type(None)]
        if set(members) == {int, str}:
            return None  # a batch key: a position or a name in the batch, not a value to vary
        options = [st.none()] if len(members) < len(typing.get_args(hint)) else []
        for member in members:
            own = default if isinstance(member, type) and _instance_of(default, member) else None
            suggested = _suggested(member, own, cls)
            if suggested is not None:
                options.append(suggested)
        return st.one_of(options) if options else None
    if hint is int:
        count = default if is_integer(default) else 0
        return st.integers(min(count, 0), max(2 * count, 8))
    if hint is float:
        scale = float(default) if is_real(default) else 0.0
        return st.floats(0.0, max(2.0 * scale, 1.0), allow_nan=False, allow_infinity=False)
    if hint is str and isinstance(default, str):
        time_like = _time_like(default)
        return time_like if time_like is not None else _named_choices(default, cls)
    return None


def _instance_of(value: Any, member: type) -> bool:
    if isinstance(value, bool):
        return member is bool
    return isinstance(value, member)


def _time_like(default: str) -> SearchStrategy[str] | None:
    try:
        time = Time.from_timestring(default)
    except ValueError:
        return None
    if time.unit is TimeUnit.DURATION:
        fractions = st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False)
        return fractions.map(lambda value: Time(value, TimeUnit.DURATION).to_timestring())
    counts = st.integers(0, max(2 * int(time.value), 10))
    return counts.map(lambda value: Time(value, time.unit).to_timestring())


def _named_choices(default: str, cls: type) -> SearchStrategy[str] | None:
    # The accepted values of a string field are, by the project's habit, a module-level collection
    # (``CLIPPING_TYPES``, ``MODES``, a mapping by name) in the record's module or in a helper module of its
    # package that it imports (``_augment.augmentation_sets``).
    found: set[str] = set()
    for module in _record_modules(cls):
        for name, value in vars(module).items():
            if name.startswith("__") or not isinstance(value, Mapping | tuple | list | set | frozenset):
                continue
            members = list(value)
            if members and all(isinstance(m, str) for m in members) and default in members:
                found.update(members)
    found.discard(default)
    return st.sampled_from(sorted(found)) if found else None


def _record_modules(cls: type) -> list[types.ModuleType]:
    modules: dict[str, types.ModuleType] = {}
    for owner in cls.__mro__:
        module = sys.modules.get(owner.__module__)
        if owner is Algorithm or not issubclass(owner, Algorithm) or module is None:
            continue
        modules[module.__name__] = module
        package = module.__name__.rpartition(".")[0]
        for value in list(vars(module).values()):
            if package and isinstance(value, types.ModuleType) and value.__name__.startswith(package + "."):
                modules.setdefault(value.__name__, value)
    return list(modules.values())


def _constructs(cls: type[Algorithm], values: Mapping[str, Any]) -> bool:
    try:
        cls(**values)
    except (ValueError, TypeError):
        return False
    return True


@st.composite
def _hyperparameters(
    draw: DrawFn,
    cls: type[Algorithm],
    names: list[str],
    defaults: Mapping[str, Callable[[], Any]],
    free: Mapping[str, SearchStrategy[Any]],
    kept: Mapping[str, SearchStrategy[Any]],
) -> dict[str, Any]:
    given = {name: draw(strategy) for name, strategy in kept.items()}
    drawn = {name: draw(strategy) for name, strategy in free.items()}
    values = {**{name: make() for name, make in defaults.items()}, **drawn, **given}
    if not _constructs(cls, values):
        # Some drawn values conflict (swa_end before swa_start, both of EMA's half_life and smoothing): start
        # from the defaults and take each drawn value that still constructs, in field order.
        values = {**{name: make() for name, make in defaults.items()}, **given}
        if not _constructs(cls, values):
            reject()
        for name in names:
            if name in drawn and _constructs(cls, {**values, name: drawn[name]}):
                values[name] = drawn[name]
    return {name: values[name] for name in names}


def algorithms(
    *, names: Sequence[str] | None = None, modality: str | None = None
) -> SearchStrategy[Algorithm]:
    """Returns a strategy for algorithm records built from ``hyperparameters`` of a registered class.

    ``names`` picks registered names (by default every built-in algorithm of ``composer_fn.algorithms``);
    ``modality`` (``"image"`` or ``"tokens"``) keeps those whose check settings work on that kind of batch.
    Failures shrink towards records with few fields, at their defaults.
    """
    if names is None:
        chosen = [
            name for name, cls in REGISTRY.items() if cls.__module__.startswith(_builtin_algorithms.__name__)
        ]
    else:
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise ValueError(f"names={names!r} must be a sequence of registered algorithm names, or None")
        unknown = [name for name in names if name not in REGISTRY]
        if unknown:
            raise ValueError(
                f"names={names!r} holds {unknown}, not registered; registered: {', '.join(sorted(REGISTRY))}"
            )
        chosen = list(names)
    if modality is not None:
        if modality not in MODALITIES:
            raise ValueError(f"modality={modality!r} must be one of {', '.join(MODALITIES)}, or None")
        chosen = [name for name in chosen if settings_for(name).modality == modality]
    if not chosen:
        raise ValueError(f"names={names!r} with modality={modality!r} leave no algorithm to draw")
    return st.one_of(
        [hyperparameters(REGISTRY[name]).map(_builder(REGISTRY[name])) for name in sorted(set(chosen))]
    )


def _builder(cls: type[Algorithm]) -> Callable[[dict[str, Any]], Algorithm]:
    def build(values: dict[str, Any]) -> Algorithm:
        return cls(**values)

    return build
