"""StochasticDepth: drop residual branches at random while training (Huang et al., 2016; Composer's ``StochasticDepth``).

A residual block computes ``relu(branch(x) + shortcut(x))``. Model surgery at INIT wraps the last layer of
each target block's branch (``bn2`` of a ``BasicBlock``, ``bn3`` of a ``Bottleneck``, or the ``se`` attention
that follows it in timm's blocks) in a ``StochasticBranch``, which holds the layer's rate and key and

- in training with ``'sample'``, multiplies the branch's output by one Bernoulli(1 − p) draw per sample (a
  dropped sample's output is ``relu(shortcut(x))``);
- in training with ``'block'``, leaves the decision to its block: the block becomes a ``StochasticBlock`` of
  its own class, which draws one Bernoulli(1 − p) for the batch and, when the block is dropped, returns the
  input path only, as Composer does: ``x`` itself for an identity shortcut, ``relu(shortcut(x))`` for a
  projection;
- in evaluation, multiplies by the keep probability 1 − p, the expectation of the training mask (Huang et
  al.'s convention, and Composer's; see Composer issue #372).

Run eagerly, a dropped block skips its branch: the convolutions are not computed, their parameters get no
gradient and no update (as ``torch.optim`` skips a parameter whose ``.grad`` is None: no momentum, no weight
decay that step) and their BatchNorm statistics stay as they were, which is the method's saving. Traced
(compiled or exported), the block computes its branch and multiplies it by the keep mask (behind an identity
shortcut it then selects ``x`` with ``torch.where``), and keeps the branch's BatchNorm statistics where the
block is dropped: one static graph with the eager step's forward. Its branch's parameters get zero gradients
there, which an optimizer with momentum or weight decay turns into a small step that the eager run does not
take.

The rate of the ``l``-th of ``L`` target blocks (in module order, so by depth) is ``p_l = drop_rate · (l+1)/L``
with ``'linear'`` and ``drop_rate`` with ``'uniform'``. It lives in each layer's ``drop_rate`` buffer, so a
warm-up (``drop_warmup``) that scales every rate by ``min(1, elapsed / drop_warmup)`` at BATCH_START changes
tensors only and never recompiles the step.

The draws come from each layer's ``forward_key`` buffer, which the training step fills with a fresh key per
step and layer: two steps draw differently, the same step redraws identically, and every process of a
distributed run drops the same blocks.

The block keeps its class's children under their own names, so its convolutions stay free for other
surgeries (BlurPool, SqueezeExcite) in the same run, and parameter names do not change.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake

from composer_fn.algorithms._surgery import (
    LayerKinds,
    Surgery,
    Withheld,
    replace_modules,
    warn_nothing_to_replace,
)
from composer_fn.algorithms._timing import stored_time
from composer_fn.core import random as R
from composer_fn.core import validate
from composer_fn.core.algorithm import Capabilities, HostHook, no_change, register
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static
from composer_fn.core.time import Time, Timestamp, TimeUnit
from composer_fn.nn import register_forward_key

__all__ = [
    "StochasticDepth",
    "StochasticBranch",
    "StochasticBlock",
    "stochastic_class",
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
"""Accepted ``target_layer_name`` values: ``'Bottleneck'`` (``'ResNetBottleneck'`` is Composer's name for it) and
``'BasicBlock'``: torchvision's and timm's ResNet blocks, and ``composer_fn.models.resnet``'s ``BasicBlock`` (the
classes are declared in ``StochasticDepth.blocks``)."""


def _branch_end(block: nn.Module, kind: str) -> str:
    """Returns the attribute of the last layer of ``block``'s residual branch, ``block`` being of class ``kind``."""
    last = "bn3" if kind.endswith("Bottleneck") else "bn2"
    # timm's blocks may apply an attention module (``se``) after the last norm: the branch ends there.
    return "se" if kind.startswith("timm.") and isinstance(getattr(block, "se", None), nn.Module) else last


class StochasticBranch(nn.Module):
    """The last layer of a residual branch, with the rate and key of its block: ``layer(x) · mask``.

    In training with ``stochastic_method='sample'``, ``mask`` is one Bernoulli(1 − ``drop_rate``) draw per
    sample (dim 0) from ``forward_key``; with ``'block'``, one draw for the batch, which with ``block_decides``
    the enclosing ``StochasticBlock`` reads (eagerly it skips a dropped branch, so the mask here is applied
    only when traced). In evaluation ``mask = 1 − drop_rate``. Buffers: ``drop_rate`` (0-d float),
    ``forward_key`` (filled by the training step).
    """

    drop_rate: Tensor
    forward_key: Tensor

    def __init__(
        self,
        layer: nn.Module,
        drop_rate: float,
        stochastic_method: StochasticMethod = "block",
        *,
        block_decides: bool = False,
    ) -> None:
        super().__init__()
        validate.choice("stochastic_method", stochastic_method, STOCHASTIC_METHODS)
        validate.probability("drop_rate", drop_rate)
        validate.flag("block_decides", block_decides)
        self.layer = layer
        self.stochastic_method = stochastic_method
        self.block_decides = block_decides
        device = next((t.device for t in (*layer.parameters(), *layer.buffers())), torch.device("cpu"))
        self.register_buffer("drop_rate", torch.tensor(float(drop_rate), device=device))
        register_forward_key(self)
        self.forward_key = self.forward_key.to(device)
        # A new layer takes the mode of the layer it wraps, so a rewritten model in eval mode stays in eval mode.
        self.train(layer.training)

    def extra_repr(self) -> str:
        """Returns the hyperparameters ``repr`` shows."""
        return f"stochastic_method={self.stochastic_method!r}, block_decides={self.block_decides}"

    def keep_mask(self, shape: tuple[int, ...] = ()) -> Tensor:
        """Returns the training mask of ``shape``: True where the branch is kept, with probability 1 − rate."""
        return R.bernoulli(self.forward_key, 1.0 - self.drop_rate, shape)

    def forward(self, input: Tensor) -> Tensor:
        """Returns the layer's output times the keep mask (training) or the keep probability (evaluation)."""
        output: Tensor = self.layer(input)
        if not self.training:
            return output * (1.0 - self.drop_rate).to(output.dtype)
        if self.stochastic_method == "block" and self.block_decides and _concrete(self.forward_key):
            # Eagerly the block runs its branch only when kept (see StochasticBlock): nothing to mask.
            return output
        shape = (output.shape[0],) + (1,) * (output.dim() - 1) if self.stochastic_method == "sample" else ()
        return output * self.keep_mask(shape).to(output.dtype)


def _concrete(mask: Tensor) -> bool:
    """Returns whether ``mask`` holds a real value that Python may branch on (not traced, faked or batched)."""
    return not (
        torch.compiler.is_compiling()
        or is_fake(mask)
        or torch._C._functorch.is_batchedtensor(mask)
    )


class StochasticBlock(nn.Module):
    """A residual block of ``TARGET_LAYER_NAMES`` that block-wise StochasticDepth keeps or drops as a whole.

    ``apply_stochastic_depth`` turns a block into an instance of a subclass of both this class and the block's
    own class, with the same children under the same names, and wraps the branch's last layer
    (``branch_layer``) in a ``StochasticBranch`` with ``block_decides=True``. In training with
    ``'block'``, the block draws the branch's keep mask and, when dropped, returns ``dropped_output(x)``
    (``x`` for an identity shortcut, ``relu(shortcut(x))`` for a projection), as Composer's stochastic blocks
    do. Run eagerly, a dropped block computes nothing of its branch; traced, it computes the branch, masks it
    and keeps the dropped branch's buffers as they were, which is the eager result. Otherwise (``'sample'``,
    evaluation) it is its class's forward.
    """

    branch_layer: str
    """The attribute of the branch's last layer: ``'bn2'`` (``BasicBlock``), ``'bn3'`` (``Bottleneck``) or ``'se'``
    (timm's blocks with attention); set on each block, as timm's blocks differ by instance."""
    shortcut_layer: ClassVar[str]
    """The attribute of the shortcut: ``'shortcut'`` (ours) or ``'downsample'`` (torchvision's and timm's)."""
    output_activation: ClassVar[str | None] = None
    """The attribute of the activation after the sum (timm's ``act2``/``act3``); None for ReLU."""

    def dropped_output(self, x: Tensor) -> Tensor:
        """Returns the output of the dropped block: ``x``, or ``act(shortcut(x))`` for a projection shortcut."""
        shortcut = getattr(self, self.shortcut_layer, None)
        if shortcut is None or isinstance(shortcut, nn.Identity):
            return x
        activation = getattr(self, self.output_activation) if self.output_activation else F.relu
        output: Tensor = activation(shortcut(x))
        return output

    def forward(self, x: Tensor) -> Tensor:
        """Returns the block's output, its branch dropped by its keep mask in training with ``'block'``."""
        branch = getattr(self, self.branch_layer)
        if not (self.training and isinstance(branch, StochasticBranch) and branch.stochastic_method == "block"):
            return super().forward(x)
        keep = branch.keep_mask()
        if _concrete(keep):
            return super().forward(x) if bool(keep) else self.dropped_output(x)
        return self._select(keep, x)

    def _select(self, keep: Tensor, x: Tensor) -> Tensor:
        # One forward, whose branch is multiplied by the keep mask (its StochasticBranch does so when traced): a
        # dropped block with a projection then gives relu(shortcut(x)) already, one with an identity shortcut
        # is selected to x. The branch's buffers (BatchNorm statistics) run on copies, and take the copies'
        # values only where the block is kept; the shortcut's advance either way, as they do eagerly. The
        # buffers themselves are written after the forward, so nothing autograd saved is modified.
        shortcut = getattr(self, self.shortcut_layer, None)
        outside = {id(m) for m in shortcut.modules()} if shortcut is not None else set()
        slots = [
            (module._buffers, name, buffer)
            for module in self.modules()
            if id(module) not in outside and not isinstance(module, StochasticBranch)
            for name, buffer in module._buffers.items()
            if buffer is not None
        ]
        tables = [(table, name) for table, name, _ in slots]
        originals = [buffer for _, _, buffer in slots]
        copies = [original.clone() for original in originals]
        try:
            for (table, name), buffer in zip(tables, copies, strict=True):
                table[name] = buffer
            output = super().forward(x)
        finally:
            for (table, name), original in zip(tables, originals, strict=True):
                table[name] = original
        with torch.no_grad():
            for original, buffer in zip(originals, copies, strict=True):
                original.copy_(torch.where(keep, buffer, original))
        if shortcut is None or isinstance(shortcut, nn.Identity):
            return torch.where(keep, output, x)
        return output


# The stochastic class of each block class, made on first use; registered in this module under its name so that
# a pickled model finds it again (``__getattr__`` below makes it in a new process).
_STOCHASTIC_CLASS_NAMES = {
    ("composer_fn.nn.residual", "BasicBlock"): "StochasticBasicBlock",
    ("torchvision.models.resnet", "BasicBlock"): "StochasticTorchvisionBasicBlock",
    ("torchvision.models.resnet", "Bottleneck"): "StochasticTorchvisionBottleneck",
    ("timm.models.resnet", "BasicBlock"): "StochasticTimmBasicBlock",
    ("timm.models.resnet", "Bottleneck"): "StochasticTimmBottleneck",
}


def stochastic_class(kind: type[nn.Module]) -> type[StochasticBlock]:
    """Returns the ``StochasticBlock`` subclass of the block class ``kind`` (one of ``TARGET_LAYER_NAMES``', or
    a subclass of one)."""
    known = next(
        (c for c in kind.__mro__ if (c.__module__, c.__qualname__) in _STOCHASTIC_CLASS_NAMES), None
    )
    if known is None:
        raise TypeError(f"kind={kind.__qualname__}: expected a block class of {', '.join(TARGET_LAYER_NAMES)}")
    if known is kind:
        name = _STOCHASTIC_CLASS_NAMES[(kind.__module__, kind.__qualname__)]
        made = globals().get(name)
    else:
        # A user's subclass of a known block: made once per class, kept beside the named ones.
        name = f"Stochastic{kind.__qualname__}"
        made = _SUBCLASSED.get(kind)
    if made is not None:
        made_class: type[StochasticBlock] = made
        return made_class
    kind_name = f"{known.__module__}.{known.__qualname__}"
    attributes = {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"{kind.__qualname__} that block-wise StochasticDepth keeps or drops whole (see StochasticBlock).",
        "branch_layer": "bn3" if known.__name__ == "Bottleneck" else "bn2",
        "shortcut_layer": "shortcut" if kind_name.startswith("composer_fn.") else "downsample",
        "output_activation": None if not kind_name.startswith("timm.") else (
            "act3" if known.__name__ == "Bottleneck" else "act2"
        ),
    }
    cls = type(name, (StochasticBlock, kind), attributes)
    if known is kind:
        globals()[name] = cls
    else:
        _SUBCLASSED[kind] = cls
    return cls


_SUBCLASSED: dict[type[nn.Module], type[StochasticBlock]] = {}


def __getattr__(name: str) -> type[StochasticBlock]:
    for (module, qualname), stochastic_name in _STOCHASTIC_CLASS_NAMES.items():
        if name == stochastic_name:
            return stochastic_class(getattr(importlib.import_module(module), qualname))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def drop_rates(
    drop_rate: float, count: int, drop_distribution: DropDistribution = "linear"
) -> tuple[float, ...]:
    """Returns the rates of ``count`` blocks in depth order: ``drop_rate · (l+1)/count`` (linear) or ``drop_rate``."""
    drop_rate = validate.probability("drop_rate", drop_rate)
    count = validate.integer("count", count, minimum=0, hint="the number of blocks")
    validate.choice("drop_distribution", drop_distribution, DROP_DISTRIBUTIONS)
    if drop_distribution == "uniform":
        return (float(drop_rate),) * count
    return tuple(drop_rate * (index + 1) / count for index in range(count))


def _target_blocks(model: nn.Module, target_layer_name: str) -> tuple[tuple[str, str], ...]:
    """Returns ``(block name, branch's last layer)`` for each block of the kind that is not stochastic yet."""
    kinds = StochasticDepth.blocks[_block_family(target_layer_name)]
    targets = []
    for name, block in model.named_modules():
        kind = kinds.kind(block)
        if kind is None:
            continue
        last = block.branch_layer if isinstance(block, StochasticBlock) else _branch_end(block, kind)
        layer = getattr(block, last, None)
        # A block whose last layer is already wrapped is stochastic: idempotence (a withheld one is left alone).
        if isinstance(layer, nn.Module) and not isinstance(layer, StochasticBranch | Withheld):
            targets.append((name, last))
    return tuple(targets)


def _block_family(target_layer_name: str) -> str:
    return "Bottleneck" if target_layer_name in ("ResNetBottleneck", "Bottleneck") else "BasicBlock"


def _stochastic_block(block: nn.Module, last: str, branch: StochasticBranch) -> nn.Module:
    # The block as an instance of its stochastic class: its own children (so that ``replace_modules`` finds them
    # in the model it copies) and tensors, its branch's last layer wrapped; its other attributes copied.
    memo: dict[int, object] = {id(x): x for x in [*block.children(), *block.parameters(), *block.buffers()]}
    stochastic = copy.deepcopy(block, memo)
    kind = stochastic_class(type(block))
    stochastic.__class__ = kind
    stochastic.__dict__["branch_layer"] = last
    stochastic._modules[last] = branch
    return stochastic


def apply_stochastic_depth(
    model: nn.Module,
    target_layer_name: str,
    stochastic_method: StochasticMethod = "block",
    drop_rate: float = 0.2,
    drop_distribution: DropDistribution = "linear",
) -> nn.Module:
    """Returns a copy of ``model`` whose target residual blocks are stochastic; ``model`` is untouched.

    Composer's ``apply_stochastic_depth`` without ``optimizers``. ``target_layer_name`` is one of
    ``TARGET_LAYER_NAMES``; each block of that kind becomes a ``StochasticBlock`` whose branch's last layer is
    a ``StochasticBranch``, with the rate ``drop_rates(drop_rate, L, drop_distribution)`` gives it by depth.
    Nothing is drawn here. Applying it twice gives the model of one application.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model of type {type(model).__name__}: expected a torch.nn.Module")
    _check(target_layer_name, stochastic_method, drop_rate, drop_distribution)
    blocks = _target_blocks(model, target_layer_name)
    if not blocks and not _branch_names(model):
        other = "BasicBlock" if _block_family(target_layer_name) == "Bottleneck" else "Bottleneck"
        found = len(_target_blocks(model, other))
        hint = f"; it holds {found} {other} blocks: use target_layer_name={other!r}" if found else ""
        looks_for = f"{target_layer_name} block (target_layer_name accepts {', '.join(TARGET_LAYER_NAMES)}){hint}"
        warn_nothing_to_replace("StochasticDepth", looks_for, model)
    rates = drop_rates(drop_rate, len(blocks), drop_distribution)
    replacements: dict[str, nn.Module] = {}
    for (name, last), rate in zip(blocks, rates, strict=True):
        layer = model.get_submodule(name).get_submodule(last)
        branch = StochasticBranch(layer, rate, stochastic_method, block_decides=True)
        # The last layer is replaced wherever it is registered, and its block (the root's class changes below).
        replacements[f"{name}.{last}" if name else last] = branch
        if name:
            replacements[name] = _stochastic_block(model.get_submodule(name), last, branch)
    rewritten = replace_modules(model, replacements)
    if blocks and blocks[0][0] == "":
        rewritten.__class__ = stochastic_class(type(model))
        rewritten.__dict__["branch_layer"] = blocks[0][1]
    return rewritten


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
            f"{', '.join(TARGET_LAYER_NAMES)} ('ResNetBottleneck' and 'Bottleneck' are torchvision's and timm's "
            "Bottleneck, 'BasicBlock' is torchvision's, timm's or composer_fn.models.resnet's)"
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
    if not isinstance(timestamp, Timestamp):
        raise TypeError(f"timestamp of type {type(timestamp).__name__}: expected a composer_fn.Timestamp")
    warmup = _parsed_warmup(stored_time("drop_warmup", drop_warmup, "500ba"))
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

    # After GhostBatchNorm it wraps the ghost layer at the end of each branch.
    rewrites_after: ClassVar[frozenset[str]] = frozenset({"ghost_batchnorm"})
    blocks: ClassVar[Mapping[str, LayerKinds]] = {
        "BasicBlock": LayerKinds(
            (),
            (
                "composer_fn.nn.residual.BasicBlock",
                "torchvision.models.resnet.BasicBlock",
                "timm.models.resnet.BasicBlock",
            ),
        ),
        "Bottleneck": LayerKinds((), ("torchvision.models.resnet.Bottleneck", "timm.models.resnet.Bottleneck")),
    }
    """The residual blocks it makes stochastic, by ``target_layer_name`` (``'ResNetBottleneck'`` is
    ``'Bottleneck'``): those of torchvision's and timm's ResNets and of ``composer_fn.nn.residual``."""

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

    def changes_nothing(self) -> str | None:
        why, instead = "no block is ever dropped", "drop_rate > 0 (Composer's default is 0.2)"
        return no_change("StochasticDepth", "drop_rate=0", why, instead) if self.drop_rate == 0 else None

    @property
    def _warms_up(self) -> bool:
        return _parsed_warmup(self.drop_warmup).value > 0

    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities(), unshardable=self.unshardable)

    def unshardable(self, module: object) -> str | None:
        """Why a sharded run of ``module`` cannot run this: ``stochastic_method='block'`` on a model it finds blocks
        in, where a dropped block's forward is skipped on some processes and not others while a sharded block's
        parameters are gathered and its gradients reduced by every process together; None otherwise."""
        if self.stochastic_method == "block" and self.surgery_targets(module):
            return (
                "stochastic_method='block' skips a dropped block's forward, on some processes and not others, while "
                "a sharded block's parameters are gathered and its gradients reduced by every process together; "
                "stochastic_method='sample' runs sharded"
            )
        return None

    def targets(self, module: nn.Module) -> frozenset[str]:
        # The branch's last layer, which the rewrite wraps: the block keeps its other children, which stay free
        # for other surgeries.
        return frozenset(
            f"{name}.{last}" if name else last for name, last in _target_blocks(module, self.target_layer_name)
        )

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
