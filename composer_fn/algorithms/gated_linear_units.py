"""Gated linear units: each transformer feed-forward becomes ``down(act(gate(x)) * up(x))`` (Shazeer, 2020).

Surgery at INIT: every ``blocks[i].feed_forward`` (``down(act(up(x)))``, see the protocol in
``composer_fn.nn.blocks``) is replaced by a ``GatedFeedForward`` of the same widths ``d`` (model) and
``f`` (feed-forward, which Composer keeps): ``gate`` and ``up`` map ``d -> f``, ``down`` maps ``f -> d``. The
new layers are new parameters drawn from the surgery's key (PyTorch's default initialisation, keyed), as
Composer builds fresh layers; the old feed-forward's weights are dropped.

Hugging Face models: BERT's ``BertIntermediate`` (``act(dense(x))``) becomes a ``GatedIntermediate``
(``act(gate(x)) * up(x)``) and GPT-2's ``GPT2MLP`` a ``GatedMLP`` (``dropout(c_proj(act(gate(x)) * up(x)))``).
``gate`` and ``up`` are new, drawn from the key; what follows them in the block (BERT's ``output.dense``,
dropout and LayerNorm, GPT-2's ``c_proj`` and dropout) keeps its weights, so a pretrained model keeps every
layer the gating does not replace. Composer's BERT surgery builds the whole feed-forward anew, its output
projection and LayerNorm included. Llama's ``LlamaMLP`` is gated already: the surgery warns that it changes
nothing.

Parameter count of one block's feed-forward, with ``g`` and ``u`` 1 when ``gated_layer_bias`` and
``non_gated_layer_bias`` are set and 0 otherwise::

    before: d*f + f + f*d + d                     (up with bias, down with bias)
    after:  d*f + g*f + d*f + u*f + f*d + d       (gate, up, down; down keeps its bias)
    change: d*f + (g + u - 1) * f

The activation is the block's own (``feed_forward.activation``) when ``act_fn`` is None, else the named one
(``"sigmoid"`` gives the original GLU, ``"gelu"`` GEGLU, ``"relu"`` ReGLU, ``"silu"`` SwiGLU).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from composer_fn.algorithms import _transformers as hf
from composer_fn.algorithms._surgery import Surgery, replace_modules, warn_nothing_to_replace
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import register
from composer_fn.nn import has_protocol_blocks, init_parameters, protocol_attribute, protocol_blocks

__all__ = [
    "GatedLinearUnits",
    "GatedFeedForward",
    "ACTIVATIONS",
    "apply_gated_linear_units",
    "feed_forward_parameter_change",
]

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
}
"""The activations ``act_fn`` may name, by name."""


class _Activation(nn.Module):
    """Wraps a plain function as a module, so the feed-forward can hold any callable activation."""

    def __init__(self, function: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: Tensor) -> Tensor:
        """Returns ``function(x)``."""
        return self.function(x)


class GatedFeedForward(nn.Module):
    """The gated feed-forward ``down(activation(gate(x)) * up(x))`` of widths ``d_model -> d_ff -> d_model``."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: nn.Module,
        *,
        gated_layer_bias: bool = False,
        non_gated_layer_bias: bool = False,
    ) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=gated_layer_bias)
        self.up = nn.Linear(d_model, d_ff, bias=non_gated_layer_bias)
        self.activation = activation
        self.down = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """Returns ``down(activation(gate(x)) * up(x))``, of the shape of ``x``."""
        return self.down(self.activation(self.gate(x)) * self.up(x))


def feed_forward_parameter_change(
    d_model: int, d_ff: int, *, gated_layer_bias: bool = False, non_gated_layer_bias: bool = False
) -> int:
    """Returns how many parameters one block gains from the surgery: ``d*f + (g + u - 1) * f``.

    ``g`` and ``u`` are 1 for a gated and a non-gated bias respectively (see the module docstring);
    ``d_model`` and ``d_ff`` are widths, ints >= 1.
    """
    d_model = validate.integer("d_model", d_model, minimum=1, hint="the model width")
    d_ff = validate.integer("d_ff", d_ff, minimum=1, hint="the feed-forward width")
    validate.flag("gated_layer_bias", gated_layer_bias)
    validate.flag("non_gated_layer_bias", non_gated_layer_bias)
    return d_model * d_ff + (int(gated_layer_bias) + int(non_gated_layer_bias) - 1) * d_ff


def _activation(
    act_fn: str | nn.Module | Callable[[Tensor], Tensor] | None, feed_forward: nn.Module, where: str
) -> nn.Module:
    if act_fn is None:
        current = protocol_attribute(feed_forward, "activation", where)
        if not callable(current):
            raise TypeError(
                f"{where}.activation is a {type(current).__name__}: expected a module or callable"
            )
        return copy.deepcopy(current) if isinstance(current, nn.Module) else _Activation(current)
    if isinstance(act_fn, str):
        return ACTIVATIONS[act_fn]()
    if isinstance(act_fn, nn.Module):
        return copy.deepcopy(act_fn)
    return _Activation(act_fn)


def _check_act_fn(act_fn: object) -> None:
    if isinstance(act_fn, str):
        if act_fn not in ACTIVATIONS:
            raise ValueError(f"act_fn={act_fn!r} must be None or one of {', '.join(sorted(ACTIVATIONS))}")
    elif act_fn is not None and not callable(act_fn):
        raise TypeError(f"act_fn={act_fn!r}: expected None, an activation name, a module or a callable")


def _glu_targets(model: nn.Module) -> dict[str, nn.Module]:
    found: dict[str, nn.Module] = {}
    if hf.is_transformers_model(model):
        for name, module in model.named_modules():
            if hf.class_named(module, tuple(hf.GLU_LAYERS)):
                found[name] = module
        return found
    if isinstance(model, nn.Module) and not has_protocol_blocks(model):
        return found
    for name, block in protocol_blocks(model):
        feed_forward = protocol_attribute(block, "feed_forward", f"model.{name}")
        if not isinstance(feed_forward, GatedFeedForward):
            found[f"{name}.feed_forward"] = feed_forward
    return found


def _input_layer(feed_forward: nn.Module, where: str) -> nn.Linear:
    up = protocol_attribute(feed_forward, "up", where)
    if not isinstance(up, nn.Linear):
        raise TypeError(
            f"{where}.up is a {type(up).__name__}: expected the nn.Linear(d_model, d_ff) of the protocol"
        )
    return up


def _keyed_linear(d_in: int, d_out: int, bias: bool, reference: Tensor, key: Tensor) -> nn.Linear:
    # Built on the meta device, the layer draws nothing from PyTorch's generator; the key fills it.
    with torch.device("meta"):
        layer = nn.Linear(d_in, d_out, bias=bias)
    layer = layer.to_empty(device=reference.device).to(dtype=reference.dtype)
    values = init_parameters(layer, key)
    with torch.no_grad():
        for parameter_name, parameter in layer.named_parameters():
            parameter.copy_(values[parameter_name])
    return layer


def _gated_transformers(
    model: Any,
    act_fn: str | nn.Module | Callable[[Tensor], Tensor] | None,
    gated_layer_bias: bool,
    non_gated_layer_bias: bool,
    key: Tensor,
) -> nn.Module:
    targets = _glu_targets(model)
    if not targets and not any(isinstance(m, hf.GatedIntermediate) for m in model.modules()):
        gated = [name for name, m in model.named_modules() if hf.class_named(m, hf.GATED_ALREADY)]
        reason = f" ({type(model.get_submodule(gated[0])).__name__} is gated already)" if gated else ""
        warn_nothing_to_replace(
            "GatedLinearUnits", " or ".join(c.rpartition(".")[2] for c in hf.GLU_LAYERS) + reason, model, stacklevel=4
        )
    replacements: dict[str, nn.Module] = {}
    for name, feed_forward in targets.items():
        projection_name, activation_name = next(v for c, v in hf.GLU_LAYERS.items() if hf.class_named(feed_forward, (c,)))
        projection: Any = feed_forward.get_submodule(projection_name)
        # nn.Linear holds [d_ff, d_model]; GPT-2's Conv1D holds the transpose, [d_model, d_ff].
        d_ff, d_model = projection.weight.shape if isinstance(projection, nn.Linear) else projection.weight.shape[::-1]
        layer_key = R.fold_in(key, R.name_to_int(name))
        gate = _keyed_linear(d_model, d_ff, gated_layer_bias, projection.weight, R.fold_in(layer_key, 0))
        up = _keyed_linear(d_model, d_ff, non_gated_layer_bias, projection.weight, R.fold_in(layer_key, 1))
        where = f"model.{name}"
        if act_fn is None:
            current = getattr(feed_forward, activation_name)
            activation = copy.deepcopy(current) if isinstance(current, nn.Module) else _Activation(current)
        else:
            activation = _activation(act_fn, feed_forward, where)
        if hasattr(feed_forward, "c_proj"):
            layers: Any = feed_forward
            replacements[name] = hf.GatedMLP(gate, up, activation, layers.c_proj, layers.dropout)
        else:
            replacements[name] = hf.GatedIntermediate(gate, up, activation)
    return replace_modules(model, replacements)


def apply_gated_linear_units(
    model: nn.Module,
    act_fn: str | nn.Module | Callable[[Tensor], Tensor] | None = None,
    gated_layer_bias: bool = False,
    non_gated_layer_bias: bool = False,
    *,
    key: R.Key,
) -> nn.Module:
    """Returns a copy of ``model`` whose feed-forwards are gated linear units; ``model`` is untouched.

    ``model`` follows the transformer protocol (``composer_fn.nn.blocks``): a model without ``blocks`` comes
    back as an unchanged copy with a warning, as from every surgery that finds nothing to replace; blocks
    that break the protocol raise a TypeError naming the missing attribute. Each replaced ``blocks.i.feed_forward`` draws its
    parameters from ``fold_in(key, name_to_int("blocks.i.feed_forward"))`` with ``init_parameters``, in the
    old layer's dtype and device. Feed-forwards that are already gated are kept, so applying twice equals
    applying once.

    Args:
        model: the transformer to rewrite.
        act_fn: None (each block keeps its own activation), a name from ``ACTIVATIONS``, a module or a callable.
        gated_layer_bias: whether ``gate`` has a bias.
        non_gated_layer_bias: whether ``up`` has a bias.
        key: the key the new parameters are drawn from.
    """
    _check_act_fn(act_fn)
    validate.flag("gated_layer_bias", gated_layer_bias)
    validate.flag("non_gated_layer_bias", non_gated_layer_bias)
    if not isinstance(key, Tensor) or key.dtype != torch.int64 or key.shape != (2,):
        raise ValueError(f"key={key!r} must be one key: an int64 tensor of shape [2], e.g. key(0)")
    replacements: dict[str, nn.Module] = {}
    if hf.is_transformers_model(model):
        return _gated_transformers(model, act_fn, gated_layer_bias, non_gated_layer_bias, key)
    if not has_protocol_blocks(model):
        warn_nothing_to_replace(
            "GatedLinearUnits", "transformer blocks (model.blocks, see composer_fn.nn.blocks)", model
        )
    for name, feed_forward in _glu_targets(model).items():
        where = f"model.{name}"
        up = _input_layer(feed_forward, where)
        d_model, d_ff, reference = up.in_features, up.out_features, up.weight
        # Built on the meta device, the layers draw nothing from PyTorch's generator; the key fills them. The
        # activation joins afterwards, so that one with parameters of its own keeps their values.
        with torch.device("meta"):
            gated = GatedFeedForward(
                d_model,
                d_ff,
                nn.Identity(),
                gated_layer_bias=gated_layer_bias,
                non_gated_layer_bias=non_gated_layer_bias,
            )
        gated = gated.to_empty(device=reference.device).to(dtype=reference.dtype)
        values = init_parameters(gated, R.fold_in(key, R.name_to_int(name)))
        with torch.no_grad():
            for parameter_name, parameter in gated.named_parameters():
                parameter.copy_(values[parameter_name])
        gated.activation = _activation(act_fn, feed_forward, where)
        replacements[name] = gated
    return replace_modules(model, replacements)


@register
@dataclass(frozen=True)
class GatedLinearUnits(Surgery):
    """Replaces every transformer feed-forward by a gated linear unit at INIT (Composer's ``GatedLinearUnits``).

    Args:
        act_fn: None (keep each block's activation) or a name from ``ACTIVATIONS``. Composer takes any
            callable; a record holds a name so that it stays JSON-serializable (``apply_gated_linear_units``
            takes callables).
        gated_layer_bias: whether the gate's linear layer has a bias.
        non_gated_layer_bias: whether the other input linear layer has a bias.
    """

    act_fn: str | None = None
    gated_layer_bias: bool = False
    non_gated_layer_bias: bool = False

    def __post_init__(self) -> None:
        if self.act_fn is not None and not isinstance(self.act_fn, str):
            raise TypeError(
                f"act_fn={self.act_fn!r}: the record takes None or an activation name "
                f"({', '.join(sorted(ACTIVATIONS))}); pass callables to apply_gated_linear_units"
            )
        _check_act_fn(self.act_fn)
        validate.flag("gated_layer_bias", self.gated_layer_bias)
        validate.flag("non_gated_layer_bias", self.non_gated_layer_bias)

    def targets(self, module: nn.Module) -> frozenset[str]:
        return frozenset(_glu_targets(module))

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        return apply_gated_linear_units(
            module,
            self.act_fn,
            gated_layer_bias=self.gated_layer_bias,
            non_gated_layer_bias=self.non_gated_layer_bias,
            key=key,
        )
