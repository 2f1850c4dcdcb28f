"""StochasticDepth: drop residual branches at random while training (Huang et al., 2016; Composer's ``StochasticDepth``).

A residual block computes ``relu(branch(x) + shortcut(x))``. Model surgery at INIT wraps the last layer of
each target block's branch (``bn2`` of a ``BasicBlock``, ``bn3`` of torchvision's ``Bottleneck``) in a
``StochasticBranch``, which multiplies the branch's output by

- in training, a Bernoulli(1 − p) draw: one for the whole batch (``'block'``: the block is dropped, its output
  is ``relu(shortcut(x))``) or one per sample (``'sample'``);
- in evaluation, the keep probability 1 − p, the expectation of the training mask (Huang et al.'s convention,
  and Composer's; see Composer issue #372).

The rate of the ``l``-th of ``L`` target blocks (in module order, so by depth) is ``p_l = drop_rate · (l+1)/L``
with ``'linear'`` and ``drop_rate`` with ``'uniform'``. It lives in each layer's ``drop_rate`` buffer, so a
warm-up (``drop_warmup``) that scales every rate by ``min(1, elapsed / drop_warmup)`` at BATCH_START changes
tensors only and never recompiles the step.

The draws come from each layer's ``forward_key`` buffer, which the training step fills with a fresh key per
step and layer: two steps draw differently, the same step redraws identically, and every process of a
distributed run drops the same blocks. A dropped branch is still computed (multiplied by zero, so its
parameters get zero gradients): the step keeps one static graph, which fuses and compiles, rather than
branching on a random value.

Wrapping the branch's last layer instead of replacing the block leaves the block's convolutions free for other
surgeries (BlurPool, SqueezeExcite) in the same run.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from composer_fn.algorithms._surgery import Surgery, replace_modules, shared_copy, warn_nothing_to_replace
from composer_fn.algorithms._timing import stored_time
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import HostHook, register
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.nn import register_forward_key
from composer_fn.nn.residual import BasicBlock

__all__ = [
    "StochasticDepth",
    "StochasticBranch",
    "apply_stochastic_depth",
    "drop_rates",
    "warmup_factor",
    "STOCHASTIC_METHODS",
    "DROP_DISTRIBUTIONS",
    "TARGET_LAYER_NAMES",
]

StochasticMethod = Literal["block", "sample"]
DropDistribution = Literal["linear", "uniform"]
STOCHASTIC_METHODS: tuple[str, ...] = ("block", "sample")
DROP_DISTRIBUTIONS: tuple[str, ...] = ("linear", "uniform")
TARGET_LAYER_NAMES: tuple[str, ...] = ("ResNetBottleneck", "Bottleneck", "BasicBlock")
"""Accepted ``target_layer_name`` values: torchvision's ``Bottleneck`` (``'ResNetBottleneck'`` is Composer's name
for it) and ``'BasicBlock'``, which covers torchvision's and ``composer_fn.models.resnet``'s."""


def _block_kinds(target_layer_name: str) -> tuple[tuple[type[nn.Module], str], ...]:
    """Returns ``(block class, name of the branch's last layer)`` for each class ``target_layer_name`` covers."""
    # Imported on first use: torchvision takes about a second to import, and most runs never ask.
    from torchvision.models import resnet as torchvision_resnet

    if target_layer_name in ("ResNetBottleneck", "Bottleneck"):
        return ((torchvision_resnet.Bottleneck, "bn3"),)
    return ((BasicBlock, "bn2"), (torchvision_resnet.BasicBlock, "bn2"))


class StochasticBranch(nn.Module):
    """The last layer of a residual branch, whose output is kept or dropped: ``layer(x) · mask``.

    In training, ``mask`` is a Bernoulli(1 − ``drop_rate``) draw from ``forward_key``: one for the batch with
    ``stochastic_method='block'``, one per sample (dim 0) with ``'sample'``. In evaluation ``mask = 1 −
    drop_rate``. Buffers: ``drop_rate`` (0-d float), ``forward_key`` (filled by the training step).
    """

    drop_rate: Tensor
    forward_key: Tensor

    def __init__(
        self, layer: nn.Module, drop_rate: float, stochastic_method: StochasticMethod = "block"
    ) -> None:
        super().__init__()
        validate.choice("stochastic_method", stochastic_method, STOCHASTIC_METHODS)
        validate.probability("drop_rate", drop_rate)
        self.layer = layer
        self.stochastic_method = stochastic_method
        device = next((t.device for t in (*layer.parameters(), *layer.buffers())), torch.device("cpu"))
        self.register_buffer("drop_rate", torch.tensor(float(drop_rate), device=device))
        register_forward_key(self)
        self.forward_key = self.forward_key.to(device)
        # A new layer takes the mode of the layer it wraps, so a rewritten model in eval mode stays in eval mode.
        self.train(layer.training)

    def extra_repr(self) -> str:
        return f"stochastic_method={self.stochastic_method!r}"

    def forward(self, input: Tensor) -> Tensor:
        """Returns the layer's output times the keep mask (training) or the keep probability (evaluation)."""
        output: Tensor = self.layer(input)
        keep = 1.0 - self.drop_rate
        if not self.training:
            return output * keep.to(output.dtype)
        shape = (output.shape[0],) + (1,) * (output.dim() - 1) if self.stochastic_method == "sample" else ()
        mask = R.bernoulli(self.forward_key, keep, shape)
        return output * mask.to(output.dtype)


def drop_rates(
    drop_rate: float, count: int, drop_distribution: DropDistribution = "linear"
) -> tuple[float, ...]:
    """Returns the rates of ``count`` blocks in depth order: ``drop_rate · (l+1)/count`` (linear) or ``drop_rate``."""
    validate.probability("drop_rate", drop_rate)
    validate.choice("drop_distribution", drop_distribution, DROP_DISTRIBUTIONS)
    if drop_distribution == "uniform":
        return (float(drop_rate),) * count
    return tuple(drop_rate * (index + 1) / count for index in range(count))


def _stochastic_depth_targets(model: nn.Module, target_layer_name: str) -> tuple[str, ...]:
    targets = []
    for name, block in model.named_modules():
        for kind, last in _block_kinds(target_layer_name):
            layer = getattr(block, last, None) if isinstance(block, kind) else None
            # A block whose last layer is already wrapped is stochastic: idempotence.
            if isinstance(layer, nn.Module) and not isinstance(layer, StochasticBranch):
                targets.append(f"{name}.{last}" if name else last)
                break
    return tuple(targets)


def apply_stochastic_depth(
    model: nn.Module,
    target_layer_name: str,
    stochastic_method: StochasticMethod = "block",
    drop_rate: float = 0.2,
    drop_distribution: DropDistribution = "linear",
) -> nn.Module:
    """Returns a copy of ``model`` whose target residual blocks are stochastic; ``model`` is untouched.

    Composer's ``apply_stochastic_depth`` without ``optimizers``. ``target_layer_name`` is one of
    ``TARGET_LAYER_NAMES``; each block of that kind gets a ``StochasticBranch`` around the last layer of its
    branch, with the rate ``drop_rates(drop_rate, L, drop_distribution)`` gives it by depth. Nothing is drawn
    here. Applying it twice gives the model of one application.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model of type {type(model).__name__}: expected a torch.nn.Module")
    _check(target_layer_name, stochastic_method, drop_rate, drop_distribution)
    names = _stochastic_depth_targets(model, target_layer_name)
    if not names and not _branch_names(model):
        looks_for = f"{target_layer_name} block (target_layer_name accepts {', '.join(TARGET_LAYER_NAMES)})"
        warn_nothing_to_replace("StochasticDepth", looks_for, model)
    rates = drop_rates(drop_rate, len(names), drop_distribution)
    replacements: dict[str, nn.Module] = {
        name: StochasticBranch(shared_copy(model.get_submodule(name)), rate, stochastic_method)
        for name, rate in zip(names, rates, strict=True)
    }
    return replace_modules(model, replacements)


def _branch_names(model: nn.Module) -> tuple[str, ...]:
    return tuple(name for name, m in model.named_modules() if isinstance(m, StochasticBranch))


# The trainer's structure module is never edited (surgery returns new modules), so the warm-up hook may look
# its layers up once instead of walking the module tree every batch; weak keys let finished runs' models go.
_BRANCH_NAMES: weakref.WeakKeyDictionary[nn.Module, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _static_branch_names(model: nn.Module) -> tuple[str, ...]:
    names = _BRANCH_NAMES.get(model)
    if names is None:
        names = _BRANCH_NAMES[model] = _branch_names(model)
    return names


def _check(target_layer_name: str, stochastic_method: str, drop_rate: float, drop_distribution: str) -> None:
    if target_layer_name not in TARGET_LAYER_NAMES:
        raise ValueError(
            f"target_layer_name={target_layer_name!r} is not a block we make stochastic; accepted: "
            f"{', '.join(TARGET_LAYER_NAMES)} ('ResNetBottleneck' and 'Bottleneck' are torchvision's Bottleneck, "
            "'BasicBlock' is torchvision's or composer_fn.models.resnet's)"
        )
    validate.choice("stochastic_method", stochastic_method, STOCHASTIC_METHODS)
    validate.probability("drop_rate", drop_rate)
    validate.choice("drop_distribution", drop_distribution, DROP_DISTRIBUTIONS)


@functools.lru_cache(maxsize=64)
def _parsed_warmup(drop_warmup: float | str) -> Time:
    units = (TimeUnit.DURATION, TimeUnit.BATCH)
    time = validate.time("drop_warmup", drop_warmup, units, "0.1dur", number_unit=TimeUnit.DURATION)
    if time.unit is TimeUnit.DURATION and time.value > 1:
        raise ValueError(f"drop_warmup={drop_warmup!r} must be a fraction of the run in [0, 1]")
    return time


def _warmup_batches(warmup: Time, timestamp: Timestamp) -> float | None:
    """Returns the warm-up's length in batches, or None for a fraction of a run not measured in batches."""
    if warmup.unit is TimeUnit.BATCH:
        return float(warmup.value)
    run = timestamp.max_duration
    return float(warmup.value) * float(run.value) if run is not None and run.unit is TimeUnit.BATCH else None


def warmup_factor(drop_warmup: float | str, timestamp: Timestamp) -> float:
    """Returns the fraction of the full drop rates in use at ``timestamp``: ``min(1, elapsed / drop_warmup)``.

    ``drop_warmup`` is a fraction of the run (a float or ``'0.1dur'``) or a number of batches (``'500ba'``);
    zero means no warm-up (factor 1).
    """
    warmup = _parsed_warmup(drop_warmup)
    if warmup.value == 0:
        return 1.0
    batches = _warmup_batches(warmup, timestamp)
    if batches is not None:
        return min(1.0, timestamp.batch / batches)
    if timestamp.max_duration is None:
        raise ValueError(
            f"drop_warmup={drop_warmup!r} is a fraction of the run, but the timestamp has no max_duration; set it "
            "with timestamp.with_max_duration(...) (the Trainer does) or give drop_warmup in ba"
        )
    return min(1.0, timestamp.elapsed / float(warmup.value))


@register
@dataclass(frozen=True)
class StochasticDepth(Surgery):
    """Drops residual branches at random in training (Composer's ``StochasticDepth``; see the module docstring).

    Args:
        target_layer_name: the kind of block to make stochastic, one of ``TARGET_LAYER_NAMES``. Composer
            requires it; its default here, Composer's only accepted value, lets the registry build the record
            without arguments.
        stochastic_method: ``'block'`` (one draw per batch and block) or ``'sample'`` (one per sample).
        drop_rate: the drop probability of the deepest block (``'linear'``) or of every block (``'uniform'``).
        drop_distribution: ``'linear'`` or ``'uniform'``.
        drop_warmup: the rates ramp linearly from 0 over this much of the run: a fraction (float, or
            ``'0.1dur'``) or a number of batches (``'500ba'``); 0 for none. Unlike Composer, it also works with
            ``'sample'``.
    """

    target_layer_name: str = "ResNetBottleneck"
    stochastic_method: StochasticMethod = "block"
    drop_rate: float = 0.2
    drop_distribution: DropDistribution = "linear"
    drop_warmup: float | str = 0.0

    def __post_init__(self) -> None:
        _check(self.target_layer_name, self.stochastic_method, self.drop_rate, self.drop_distribution)
        warmup = stored_time("drop_warmup", self.drop_warmup, "500ba")
        _parsed_warmup(warmup)
        # One canonical, JSON-friendly form, so equal warm-ups are equal records.
        object.__setattr__(self, "drop_warmup", warmup)

    @property
    def _warms_up(self) -> bool:
        return _parsed_warmup(self.drop_warmup).value > 0

    def targets(self, module: nn.Module) -> frozenset[str]:
        return frozenset(_stochastic_depth_targets(module, self.target_layer_name))

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        return apply_stochastic_depth(
            module, self.target_layer_name, self.stochastic_method, self.drop_rate, self.drop_distribution
        )

    def host_hooks(self) -> Mapping[Event, HostHook]:
        hooks = dict(super().host_hooks())
        if self._warms_up:
            hooks[Event.BATCH_START] = self._warm_up
        return hooks

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        if event is not Event.BATCH_START:
            return True
        # Runs while the rates still change, up to the first batch at which the warm-up is complete; every batch
        # when the warm-up's length in batches is unknown.
        batches = _warmup_batches(_parsed_warmup(self.drop_warmup), timestamp)
        return batches is None or timestamp.batch < batches + 1

    def _warm_up(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        names = _static_branch_names(static.module)
        factor = warmup_factor(self.drop_warmup, timestamp)
        buffers = dict(state.buffers)
        for name, rate in zip(
            names, drop_rates(self.drop_rate, len(names), self.drop_distribution), strict=True
        ):
            current = buffers[f"{name}.drop_rate"]
            # A new tensor per layer, not views of one: the step's inputs must not alias each other.
            buffers[f"{name}.drop_rate"] = torch.full(
                (), rate * factor, dtype=current.dtype, device=current.device
            )
        return static, state.replace(buffers=buffers)
