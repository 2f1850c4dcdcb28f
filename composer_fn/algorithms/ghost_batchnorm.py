"""GhostBatchNorm: batch normalization over chunks of the batch (Hoffer et al., 2017, "ghost batches").

In training, ``GhostBatchNorm{1,2,3}d`` splits the batch along dim 0 into ``ceil(B / ghost_batch_size)``
chunks (``Tensor.chunk``, so the chunks have ``ceil(B / chunks)`` samples and the last may have fewer) and
normalizes each with its own mean and variance, as Composer does. The running statistics are updated once
per chunk, in order, with the momentum divided by the number of chunks, so that a step moves them about as
far as one BatchNorm update would; ``num_batches_tracked`` advances by the number of chunks. With a single
chunk this is exactly ``BatchNorm``. In evaluation the whole batch is normalized with the running statistics,
which is what normalizing each chunk with them gives (a layer without running statistics normalizes each
chunk with its own, in evaluation too).

Differences from Composer: a batch of at most ``ghost_batch_size`` samples (the last, smaller batch of an
epoch, or an evaluation batch) is normalized as one chunk, where Composer raises ``ValueError``; with
``momentum=None`` (a cumulative average) each chunk counts as one batch, where Composer fails. The layers are
subclasses of ``BatchNorm{1,2,3}d`` with the same parameters and buffers, not wrappers around one, so the
tensors keep their names.

Subclasses of ``BatchNorm{1,2,3}d`` that keep its ``forward`` are replaced too, and timm's ``BatchNormAct2d``
(BatchNorm, then a dropout and an activation) becomes a ``GhostBatchNormAct2d``, which keeps its ``drop`` and
``act`` after the ghost normalisation (see ``GhostBatchNorm.layers``). Other subclasses compute something the ghost
layer would not, and are left alone.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composer_fn.algorithms._no_op import warn_changes_nothing_here
from composer_fn.algorithms._surgery import LayerKinds, Surgery, matching_modules, replaced
from composer_fn.core import validate
from composer_fn.core.algorithm import HostHook, register
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static
from composer_fn.core.time import Timestamp
from composer_fn.nn.sharing import shared_copy

__all__ = [
    "GhostBatchNorm",
    "GhostBatchNorm1d",
    "GhostBatchNorm2d",
    "GhostBatchNorm3d",
    "GhostBatchNormAct2d",
    "apply_ghost_batchnorm",
    "ghost_batchnorm_from",
]


class _GhostBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Batch normalization of chunks of ``ghost_batch_size`` samples in training (see the module docstring)."""

    def __init__(self, num_features: int, *args: Any, ghost_batch_size: int = 32, **kwargs: Any) -> None:
        """Takes BatchNorm's arguments, and ``ghost_batch_size`` by keyword."""
        validate.integer("ghost_batch_size", ghost_batch_size, minimum=1)
        super().__init__(num_features, *args, **kwargs)
        self.ghost_batch_size = ghost_batch_size

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, ghost_batch_size={self.ghost_batch_size}"

    def forward(self, input: Tensor) -> Tensor:
        """Returns ``input`` normalized chunk by chunk in training, with the running statistics in evaluation."""
        self._check_input_dim(input)
        count = math.ceil(input.shape[0] / self.ghost_batch_size)
        tracking = self.running_mean is not None and self.running_var is not None
        if count <= 1 or (tracking and not self.training):
            # BatchNorm's own forward, whatever class follows this one in a subclass's method order.
            output: Tensor = nn.modules.batchnorm._BatchNorm.forward(self, input)
            return output
        chunks = input.chunk(count, dim=0)
        updating = tracking and self.training
        momentum = None if self.momentum is None else self.momentum / len(chunks)
        normalized = []
        for chunk in chunks:
            factor = 0.0
            if updating and self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
                # BatchNorm's cumulative average when momentum is None: this chunk weighs 1 / (batches seen).
                factor = 1.0 / float(self.num_batches_tracked) if momentum is None else momentum
            normalized.append(
                F.batch_norm(
                    chunk,
                    self.running_mean if updating else None,
                    self.running_var if updating else None,
                    self.weight,
                    self.bias,
                    True,
                    factor,
                    self.eps,
                )
            )
        return torch.cat(normalized, dim=0)


class GhostBatchNorm1d(_GhostBatchNorm, nn.BatchNorm1d):
    """``BatchNorm1d`` over chunks of ``ghost_batch_size`` samples in training."""


class GhostBatchNorm2d(_GhostBatchNorm, nn.BatchNorm2d):
    """``BatchNorm2d`` over chunks of ``ghost_batch_size`` samples in training."""


class GhostBatchNorm3d(_GhostBatchNorm, nn.BatchNorm3d):
    """``BatchNorm3d`` over chunks of ``ghost_batch_size`` samples in training."""


class GhostBatchNormAct2d(GhostBatchNorm2d):
    """timm's ``BatchNormAct2d`` with ghost batches: ``act(drop(ghost_batchnorm(x)))``.

    A ``BatchNormAct2d`` re-classed keeps its children ``drop`` and ``act`` under their names.
    """

    def forward(self, input: Tensor) -> Tensor:
        """Returns ``input`` normalized as ``GhostBatchNorm2d`` does, then through the layer's dropout and activation."""
        act, drop = self.get_submodule("act"), self.get_submodule("drop")
        output: Tensor = act(drop(super().forward(input)))
        return output


_GHOSTS: dict[str, type[_GhostBatchNorm]] = {
    "torch.nn.modules.batchnorm.BatchNorm1d": GhostBatchNorm1d,
    "torch.nn.modules.batchnorm.BatchNorm2d": GhostBatchNorm2d,
    "torch.nn.modules.batchnorm.BatchNorm3d": GhostBatchNorm3d,
    "timm.layers.norm_act.BatchNormAct2d": GhostBatchNormAct2d,
}
def ghost_batchnorm_from(batchnorm: nn.Module, ghost_batch_size: int = 32) -> nn.Module:
    """Returns the ghost version of a ``BatchNorm{1,2,3}d`` with copies of its tensors; the input is untouched."""
    return _reclassed(batchnorm, copy.deepcopy(batchnorm), ghost_batch_size)


def _reclassed(batchnorm: nn.Module, ghost: nn.Module, ghost_batch_size: int) -> nn.Module:
    # A re-classed copy keeps every setting and tensor of the layer, including those only some PyTorch
    # versions have (the ``bias`` flag); the subclass adds nothing but ``ghost_batch_size``.
    kind = GhostBatchNorm.layers.kind(batchnorm)
    cls = _GHOSTS.get(kind) if kind is not None else None
    if cls is None:
        raise TypeError(f"batchnorm={type(batchnorm).__name__} must be a {GhostBatchNorm.layers.describe()}")
    ghost.__class__ = cls
    assert isinstance(ghost, _GhostBatchNorm)
    ghost.ghost_batch_size = ghost_batch_size
    return ghost


def _targets(module: nn.Module) -> list[str]:
    return list(matching_modules(module, lambda _, m: GhostBatchNorm.layers.kind(m) in _GHOSTS))


def apply_ghost_batchnorm(model: nn.Module, ghost_batch_size: int = 32) -> nn.Module:
    """Returns a copy of ``model`` whose batch norms are ghost batch norms; ``model`` is untouched.

    The layers replaced are ``BatchNorm{1,2,3}d`` (and subclasses keeping their forward) and timm's
    ``BatchNormAct2d`` (see the module docstring).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model of type {type(model).__name__}: expected a torch.nn.Module")
    ghost_batch_size = validate.integer("ghost_batch_size", ghost_batch_size, minimum=1)
    # The layers keep the model's own tensors, which ``replace_modules`` moves onto its copy: ties stay.
    replacements = {
        name: _reclassed(layer, shared_copy(layer), ghost_batch_size)
        for name in _targets(model)
        for layer in [model.get_submodule(name)]
    }
    looks_for = GhostBatchNorm.layers.describe()
    return replaced(model, replacements, method="GhostBatchNorm", looks_for=looks_for, rewritten=_GhostBatchNorm)


@register
@dataclass(frozen=True)
class GhostBatchNorm(Surgery):
    """Replaces ``BatchNorm{1,2,3}d`` by ghost batch norms at INIT (Composer's ``GhostBatchNorm``).

    Args:
        ghost_batch_size: the number of samples each chunk of a training batch is normalized over. A batch of
            at most this many samples is one chunk (plain BatchNorm): the first batch of a run says so.
    """

    algorithm_name = "ghost_batchnorm"
    layers: ClassVar[LayerKinds] = LayerKinds(
        (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d), ("timm.layers.norm_act.BatchNormAct2d",)
    )
    """BatchNorm of 1, 2 or 3 dimensions, and timm's ``BatchNormAct2d`` (BatchNorm, then its dropout and activation,
    which the ghost layer keeps)."""
    checks_at = frozenset({Event.BATCH_START})

    ghost_batch_size: int = 32

    def __post_init__(self) -> None:
        validate.integer("ghost_batch_size", self.ghost_batch_size, minimum=1)

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {**super().host_hooks(), Event.BATCH_START: self._check_batch_size}

    def match(self, event: Event, timestamp: Timestamp) -> bool:
        # The batch size is first known at the run's first batch: it is checked there, once.
        return event is not Event.BATCH_START or timestamp.batch == 0

    def _check_batch_size(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        if meta is not None and 0 < meta.batch_size <= self.ghost_batch_size:
            warn_changes_nothing_here(
                "GhostBatchNorm",
                f"GhostBatchNorm(ghost_batch_size={self.ghost_batch_size}) changes nothing on batches of "
                f"{meta.batch_size} samples: a batch of at most ghost_batch_size samples is normalized as one "
                f"chunk, which is plain BatchNorm; use ghost_batch_size < {meta.batch_size}",
            )
        return static, state

    def targets(self, module: nn.Module) -> frozenset[str]:
        return frozenset(_targets(module))

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        # The new layers keep the existing parameters and statistics: nothing is drawn, so the key is not used.
        return apply_ghost_batchnorm(module, self.ghost_batch_size)
