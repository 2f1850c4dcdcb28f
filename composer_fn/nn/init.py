"""Keyed parameter initialisation that reproduces PyTorch's defaults without its global random state.

``init_parameters`` draws a module's parameter values from a key; ``materialise`` builds a module that was
constructed on the meta device (so that it drew nothing from PyTorch's global generator) with those values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor, nn

from composer_fn.core import random as R
from composer_fn.core.random import Key, fold_in, name_to_int, normal, uniform
from composer_fn.nn.keyed import FORWARD_KEY

__all__ = ["init_parameters", "materialise", "require_key", "built_from_key"]

_NEGATIVE_SLOPE = math.sqrt(5)

# Modules whose affine parameters PyTorch resets to weight 1, bias 0.
_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)


def init_parameters(module: nn.Module, key: Key) -> dict[str, Tensor]:
    """Returns new parameter tensors, keyed by ``module.named_parameters()`` names, drawn from ``key``.

    The draws follow PyTorch's default initialisation, with our keyed samplers in place of its global
    generator:

    - ``Linear`` and convolution weights: ``kaiming_uniform_(a=sqrt(5))``, i.e. ``U(-b, b)`` with
      ``b = gain * sqrt(3 / fan_in)`` and ``gain = sqrt(2 / (1 + 5))``, which is ``b = 1 / sqrt(fan_in)``;
    - their biases: ``U(-1 / sqrt(fan_in), 1 / sqrt(fan_in))`` (zero when ``fan_in`` is 0);
    - ``Bilinear`` weight and bias: ``U(-1 / sqrt(in1_features), 1 / sqrt(in1_features))``;
    - ``Embedding`` weights: ``N(0, 1)``, with the ``padding_idx`` row zero;
    - BatchNorm/InstanceNorm/LayerNorm/GroupNorm/RMSNorm: weight 1, bias 0;
    - any other parameter: a clone of its current value.

    Parameter ``name`` draws from ``fold_in(key, name_to_int(name))``, so adding a layer does not change the
    values of the others. The result has the dtype and device of each parameter and does not require grad;
    ``module`` is not changed. Load it with ``module.load_state_dict(result, strict=False)`` or use it with
    ``torch.func.functional_call``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module={type(module).__name__} must be a torch.nn.Module")
    key = require_key(key)
    result: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            owner_name, _, attribute = name.rpartition(".")
            owner = module.get_submodule(owner_name)
            parameter_key = fold_in(key.to(parameter.device), name_to_int(name))
            result[name] = _initial_value(owner, attribute, parameter, parameter_key)
    return result


def materialise(module: nn.Module, parameter_key: Key) -> nn.Module:
    """Returns ``module``, built on the meta device, moved to the CPU with ``init_parameters(module, key)``.

    PyTorch layers draw their initial weights from the global generator as they are built. Built on the meta
    device they draw nothing, and the values are filled in here from the key instead. Normalisation
    statistics are reset and random layers' ``forward_key`` buffers set to ``key(0)``; any other buffer would hold
    uninitialised memory, so it is refused.
    """
    module.to_empty(device="cpu")
    for owner_name, owner in module.named_modules():
        buffers = [name for name, _ in owner.named_buffers(recurse=False) if name != FORWARD_KEY]
        if FORWARD_KEY in owner._buffers:
            # A random layer's key buffer: the training step fills it each forward; its stored value is key(0).
            owner._buffers[FORWARD_KEY] = R.key(0)
        if isinstance(owner, nn.modules.batchnorm._NormBase):
            owner.reset_running_stats()
        elif buffers:
            raise TypeError(
                f"module {owner_name!r} ({type(owner).__name__}) has buffers {buffers} to initialise"
            )
    values = init_parameters(module, parameter_key)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            parameter.copy_(values[name])
    return module


_Built = TypeVar("_Built")


def built_from_key(parameter_key: Key, build: Callable[[], _Built]) -> _Built:
    """Returns ``build()`` run with torch's global generator seeded from ``parameter_key`` (for a constructor that
    draws its own initial values, such as a ``transformers`` model), the generator's state restored afterwards:
    the same key builds the same module, and the caller's random state is left as it was."""
    seed = int(R.randint(parameter_key, 0, 2**24, 1)[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def require_key(key: object, argument: str = "key") -> Key:
    """Returns ``key`` if it is one key (an int64 tensor of shape [2]); raises ValueError naming ``argument``."""
    if not isinstance(key, Tensor) or key.dtype != torch.int64 or key.shape != (2,):
        raise ValueError(f"{argument}={key!r} must be one key: an int64 tensor of shape [2], e.g. key(0)")
    return key


def _initial_value(owner: nn.Module, attribute: str, parameter: Tensor, parameter_key: Key) -> Tensor:
    shape, dtype = tuple(parameter.shape), parameter.dtype
    if isinstance(owner, nn.Linear | nn.modules.conv._ConvNd) and attribute in ("weight", "bias"):
        fan_in = _fan_in(owner.weight)
        # The bias bound also comes from the weight's fan-in, as in PyTorch's reset_parameters.
        bound = _kaiming_uniform_bound(fan_in) if attribute == "weight" else _inverse_sqrt(fan_in)
        return uniform(parameter_key, shape, dtype=dtype, low=-bound, high=bound)
    if isinstance(owner, nn.Bilinear) and attribute in ("weight", "bias"):
        # Bilinear takes its bound from the first input's width alone, not from the full fan-in.
        bound = _inverse_sqrt(owner.weight.shape[1])
        return uniform(parameter_key, shape, dtype=dtype, low=-bound, high=bound)
    if isinstance(owner, nn.Embedding) and attribute == "weight":
        value = normal(parameter_key, shape, dtype=dtype)
        if owner.padding_idx is not None:
            value[owner.padding_idx] = 0
        return value
    if isinstance(owner, _NORMS) and attribute in ("weight", "bias"):
        fill = 1.0 if attribute == "weight" else 0.0
        return torch.full(shape, fill, dtype=dtype, device=parameter.device)
    return parameter.detach().clone()


def _fan_in(weight: Tensor) -> int:
    # Matches torch.nn.init._calculate_fan_in_and_fan_out: dim 1 times the receptive field.
    receptive_field = math.prod(weight.shape[2:]) if weight.dim() > 2 else 1
    return weight.shape[1] * receptive_field if weight.dim() > 1 else weight.shape[0]


def _kaiming_uniform_bound(fan_in: int) -> float:
    # The same arithmetic as torch.nn.init.kaiming_uniform_(a=sqrt(5)), which reduces to 1 / sqrt(fan_in).
    if fan_in == 0:
        return 0.0
    gain = math.sqrt(2.0 / (1 + _NEGATIVE_SLOPE**2))
    return math.sqrt(3.0) * gain / math.sqrt(fan_in)


def _inverse_sqrt(fan_in: int) -> float:
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
