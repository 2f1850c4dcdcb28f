"""Keyed parameter initialisation that reproduces PyTorch's defaults without its global random state."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from composer_fn.core.random import Key, fold_in, name_to_int, normal, uniform

__all__ = ["init_parameters"]

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
    if not isinstance(key, Tensor) or key.dtype != torch.int64 or key.shape != (2,):
        raise ValueError(f"key={key!r} must be one key: an int64 tensor of shape [2], e.g. key(0)")
    result: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            owner_name, _, attribute = name.rpartition(".")
            owner = module.get_submodule(owner_name)
            parameter_key = fold_in(key.to(parameter.device), name_to_int(name))
            result[name] = _initial_value(owner, attribute, parameter, parameter_key)
    return result


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
