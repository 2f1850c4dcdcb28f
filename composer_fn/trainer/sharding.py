"""Sharded training on torch's engine: FSDP2 (``fully_shard``) over a ``DeviceMesh``.

With ``FSDP`` options, each process holds a shard of every parameter, of its gradient and of its optimizer state
(ZeRO-3). The model is cut into units (``shard_units``: each block of a repeated stack, such as a transformer's
layers or a ResNet's residual blocks, or the classes a model names as its own units); ``shard_module`` applies
``fully_shard`` to each unit and then to the whole, so that a unit's parameters are gathered just before its
forward and its backward, and freed after.

The step (``make_sharded_step``) is torch's: the forward through the sharded module, ``backward()`` (each
gradient reduce-scattered into its parameter's ``.grad`` as a ``Shard(0)`` DTensor), then the run's optimizer on
this process's shards, in place. The optimizers are elementwise, so the arithmetic on a shard is that of the same
elements of the whole: the step is the one-process step. Each process's loss counts by its share of the global
batch (``share``; the reduction averages over the processes, so the loss is weighted by the share times their
number), so processes with batches of other sizes still give the global batch's mean gradient.

The run's state holds each parameter's local shard (``local_shards``), the very storage the module's DTensor
parameters hold: an update in place is seen by the next forward.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from composer_fn.core import validate
from composer_fn.core.state import State
from composer_fn.optim.base import GradientTransformation
from composer_fn.trainer.step import optimize

__all__ = ["FSDP", "device_mesh", "shard_units", "shard_module", "local_shards", "make_sharded_step"]

DTypeName = Literal["fp32", "bf16", "fp16"]
_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class FSDP:
    """Shards the parameters, gradients and optimizer state over the processes (ZeRO-3), with torch's ``fully_shard``.

    Args:
        reshard_after_forward: free each unit's gathered parameters after its forward (they are gathered again for
            its backward): less memory for one more all-gather a step. False keeps them to the backward.
        units: the class names of the submodules sharded as one unit (gathered together); None takes the model's
            own hint (a Hugging Face model's ``_no_split_modules``), else each block of a repeated stack (see
            ``shard_units``). A unit nested in another is its own unit.
        param_dtype: the dtype units compute in (their parameters are cast when gathered): ``'bf16'`` or
            ``'fp16'`` for mixed precision; None computes in the parameters' own dtype. The parameters, and so
            the optimizer's arithmetic, keep theirs (fp32 master weights).
        reduce_dtype: the dtype gradients are summed across processes in (``'fp32'`` by default); None reduces in
            ``param_dtype``.
        activation_checkpointing: recompute each unit's activations in the backward instead of keeping them.
        replicate: HSDP: the processes form ``replicate`` groups; each shards the model over its members and the
            groups' gradients are summed (a 2-D mesh, replicate × shard). 1 shards over every process.
    """

    reshard_after_forward: bool = True
    units: tuple[str, ...] | None = None
    param_dtype: DTypeName | None = None
    reduce_dtype: DTypeName | None = "fp32"
    activation_checkpointing: bool = False
    replicate: int = 1

    def __post_init__(self) -> None:
        validate.flag("FSDP.reshard_after_forward", self.reshard_after_forward)
        validate.flag("FSDP.activation_checkpointing", self.activation_checkpointing)
        for field in ("param_dtype", "reduce_dtype"):
            value = getattr(self, field)
            if value is not None:
                validate.choice(f"FSDP.{field}", value, tuple(_DTYPES))
        units = self.units
        if units is not None:
            if isinstance(units, str) or not all(isinstance(name, str) and name for name in units) or not units:
                raise TypeError(
                    f"FSDP.units={units!r}: expected a non-empty tuple of module class names, e.g. ('GPT2Block',), "
                    "or None"
                )
            object.__setattr__(self, "units", tuple(units))
        validate.integer("FSDP.replicate", self.replicate, minimum=1)

    def mixed_precision(self) -> Any:
        """Returns torch's ``MixedPrecisionPolicy`` of these options."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        param = _DTYPES[self.param_dtype] if self.param_dtype is not None else None
        reduce = _DTYPES[self.reduce_dtype] if self.reduce_dtype is not None else None
        return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)


def device_mesh(options: FSDP, world_size: int, device_type: str) -> Any:
    """Returns the ``DeviceMesh`` of a run on ``world_size`` processes: 1-D (``'shard'``), or with ``replicate`` > 1
    2-D (``'replicate'`` × ``'shard'``); ValueError when ``replicate`` does not divide ``world_size``."""
    from torch.distributed.device_mesh import init_device_mesh

    if world_size % options.replicate:
        raise ValueError(
            f"FSDP.replicate={options.replicate} must divide the number of processes, {world_size}: each replica "
            "group shards the model over the same number of processes"
        )
    if options.replicate == 1:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    shape = (options.replicate, world_size // options.replicate)
    return init_device_mesh(device_type, shape, mesh_dim_names=("replicate", "shard"))


def shard_units(module: nn.Module, options: FSDP) -> list[tuple[str, nn.Module]]:
    """Returns ``(qualified name, submodule)`` for each unit of ``module``, in the order of ``named_modules()``.

    Units are the submodules whose class is named in ``options.units``, else in the model's own hint (a Hugging
    Face model's ``_no_split_modules``), else each child of a stack (an ``nn.ModuleList`` or ``nn.Sequential``)
    whose children are two or more modules of one class that hold parameters: a transformer's layers, a ResNet
    stage's residual blocks. A submodule holding a parameter also held outside it (a tied weight) is no unit: the
    tie is kept in the unit around both.
    """
    named = options.units if options.units is not None else _hinted(module)
    if named is not None:
        chosen = [(name, child) for name, child in module.named_modules() if name and type(child).__name__ in named]
        if not chosen:
            found = sorted({type(child).__name__ for _, child in module.named_modules()})
            raise ValueError(
                f"FSDP.units={named!r} names no submodule of {type(module).__name__}; its classes: {', '.join(found)}"
            )
    else:
        chosen = [
            (f"{name}.{index}" if name else index, child)
            for name, stack in module.named_modules()
            if isinstance(stack, nn.ModuleList | nn.Sequential) and _repeated(stack)
            for index, child in stack.named_children()
        ]
    return [(name, unit) for name, unit in chosen if not _shares_outside(module, unit)]


def _hinted(module: nn.Module) -> tuple[str, ...] | None:
    hint = getattr(module, "_no_split_modules", None)
    if not isinstance(hint, list | tuple | set | frozenset) or not hint or not all(isinstance(n, str) for n in hint):
        return None
    return tuple(sorted(hint))


def _repeated(stack: nn.Module) -> bool:
    children = list(stack.children())
    return (
        len(children) >= 2
        and len({type(child) for child in children}) == 1
        and all(any(True for _ in child.parameters()) for child in children)
    )


def _shares_outside(module: nn.Module, unit: nn.Module) -> bool:
    inside = {id(p) for p in unit.parameters()}
    held = [id(p) for _, p in module.named_parameters(remove_duplicate=False)]
    within = [id(p) for _, p in unit.named_parameters(remove_duplicate=False)]
    return any(held.count(i) > within.count(i) for i in inside)


def shard_module(module: nn.Module, options: FSDP, mesh: Any) -> nn.Module:
    """Shards ``module`` in place over ``mesh`` (see the module docstring) and returns it: ``fully_shard`` on each
    unit (with activation checkpointing first, when asked), then on the whole."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import fully_shard

    policy = options.mixed_precision()
    for _, unit in reversed(shard_units(module, options)):  # inner units first
        if options.activation_checkpointing:
            checkpoint(unit)
        fully_shard(unit, mesh=mesh, reshard_after_forward=options.reshard_after_forward, mp_policy=policy)
    fully_shard(module, mesh=mesh, reshard_after_forward=options.reshard_after_forward, mp_policy=policy)
    return module


def local_shards(module: nn.Module) -> dict[str, Tensor]:
    """Returns each parameter of a sharded ``module`` by qualified name as this process's shard: the storage its
    DTensor parameter holds, so that an update in place is the parameter's."""
    return {name: _local(p) for name, p in module.named_parameters()}


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def make_sharded_step(
    module: nn.Module,
    loss_fn: Callable[[Any, Any], Tensor],
    tx: GradientTransformation,
    *,
    model_input: Callable[[Any], Any],
    keywords: bool = False,
    precision: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Callable[[State, Any, float], tuple[State, dict[str, Tensor]]]:
    """Returns the eager step ``(state, batch, share) -> (state, {"loss": loss})`` of a ``shard_module``-ed module.

    ``state.params`` are the module's local shards (``local_shards``). The step runs the module on
    ``model_input(batch)`` (as keyword arguments with ``keywords``) and ``loss_fn`` under ``precision()``, the
    backward of the loss weighted by ``share`` (this process's share of the global batch, see the module docstring),
    and ``tx``'s update on the
    shards of the parameters that got a gradient (as ``torch.optim`` skips a ``.grad`` of None), in place: the
    module's parameters are updated. The returned loss is this process's.
    """
    parameters = dict(module.named_parameters())
    update = functools.partial(optimize, tx, donate=True)
    processes = torch.distributed.get_world_size()  # the reduction averages over them all (shards and replicas)

    def step(state: State, batch: Any, share: float) -> tuple[State, dict[str, Tensor]]:
        with precision():
            given = model_input(batch)
            loss = loss_fn(module(**given) if keywords else module(given), batch)
        weight = share * processes
        (loss * weight if weight != 1.0 else loss).backward()
        grads = {}
        for name, parameter in parameters.items():
            if parameter.grad is not None:
                grads[name] = _local(parameter.grad)
                parameter.grad = None
        params, opt = update(grads, state.opt, state.params)
        return state.replace(params=params, opt=opt, step=state.step + 1), {"loss": loss.detach()}

    return step

