"""Sharded training on torch's engine: FSDP2 (``fully_shard``) over a ``DeviceMesh``.

With ``FSDP`` options, each process holds a shard of every parameter, of its gradient and of its optimizer state
(ZeRO-3). The model is cut into units (``shard_units``: each block of a repeated stack, such as a transformer's
layers or a ResNet's residual blocks, or the classes a model names as its own units); ``shard_module`` applies
``fully_shard`` to each unit and then to the whole, so that a unit's parameters are gathered just before its
forward and its backward, and freed after. A model built on the meta device is made unit by unit
(``materialise``), each unit just before it is sharded.

The step is ``make_train_step``'s, given the module as ``ShardedModule``: the plan's events, microbatches, keys,
loss weights and loss scaling of the one-process step, with torch's gradient: the forward through the sharded
module and ``backward()``, each gradient reduce-scattered (summed) into its parameter's ``.grad`` as a ``Shard(0)``
DTensor; then the run's optimizer on this process's shards, in place. The optimizers are elementwise, so the
arithmetic on a shard is that of the same elements of the whole: the step is the one-process step. Hooks that read
the gradients see them, and the parameters, as DTensors, so a norm over every element is the whole model's.

The run's state holds each parameter's local shard (``local_shards``), the very storage the module's DTensor
parameters hold: an update in place is seen by the next forward.
"""

from __future__ import annotations

import contextlib
import copy
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

from composer_fn.core.algorithm import Algorithm
from composer_fn.core.engine import make_plan
from composer_fn.core.state import Precision, State, Static
from composer_fn.optim.base import GradientTransformation
from composer_fn.trainer.model import module_with
from composer_fn.trainer.options import FSDP, Options
from composer_fn.trainer.sharded_files import read_shards
from composer_fn.trainer.step import StepFn, make_train_step

__all__ = [
    "FSDP",
    "check_sharded_run",
    "device_mesh",
    "shard_units",
    "shard_module",
    "materialise",
    "on_meta_device",
    "local_shards",
    "is_sharded",
    "gathered_module",
    "ShardedModule",
    "sharded_module",
    "make_sharded_step",
    "shards_tree",
    "reading_tree",
    "loaded_state",
    "read_sharded_state",
    "RunShards",
]


def check_sharded_run(options: Options, algorithms: Sequence[Algorithm], grouped: bool, model: nn.Module) -> None:
    """Raises ValueError, naming the option, for what a sharded run (``options.execution.parallelism``) of ``model``
    does not do: no process group (``grouped``), a compiled or ``func``-mode step, microbatches sized on the fly
    (``'auto'``), callbacks that read the gradients' norms (the sharded step does not report them), and the
    algorithms that cannot run sharded on the model (``Capabilities.unshardable``)."""
    execution = options.execution
    given = f"Execution.parallelism={execution.parallelism!r}"
    if not grouped:
        raise ValueError(
            f"{given} shards over the processes of a process group: launch with torchrun (composer-fn train --nproc "
            "N), or initialise torch.distributed first"
        )
    for algorithm in algorithms:
        unshardable = algorithm.capabilities().unshardable
        reason = unshardable(model) if unshardable is not None else None
        if reason is not None:
            raise ValueError(
                f"{given} does not run {type(model).__name__} with algorithm {algorithm.name!r}: {reason}; train it "
                "unsharded, or without it"
            )
    refused = [
        (execution.compile is not None, f"Execution.compile={execution.compile!r}"),
        (execution.grad_mode == "func", "Execution.grad_mode='func'"),
        (execution.microbatch_size == "auto", "Execution.microbatch_size='auto'"),
        (
            any(callback.step_norms for callback in options.reporting.callbacks),
            f"callbacks reading the gradients' norms {[type(c).__name__ for c in options.reporting.callbacks if c.step_norms]}",
        ),
    ]
    named = [name for refuse, name in refused if refuse]
    if named:
        raise ValueError(
            f"{given} does not run with {', '.join(named)} yet: a sharded run trains eagerly, by torch's backward "
            "through the sharded module, reports no gradient norms, and cannot retry a step that one process ran out "
            "of memory in (every process joins each unit's collectives); leave those out, or train unsharded"
        )


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
    chosen = [(name, child) for name, child in module.named_modules() if name and type(child).__name__ in (named or ())]
    if options.units is not None and not chosen:
        found = sorted({type(child).__name__ for _, child in module.named_modules()})
        raise ValueError(
            f"FSDP.units={named!r} names no submodule of {type(module).__name__}; its classes: {', '.join(found)}"
        )
    if not chosen:  # no hint, or one that names nothing here
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


_STRUCTURES: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()
"""Each sharded module's structure as it was before sharding, on the meta device (``gathered_module``)."""
_SHARDED: weakref.WeakKeyDictionary[nn.Module, ShardedModule] = weakref.WeakKeyDictionary()


def shard_module(module: nn.Module, options: FSDP, mesh: Any, *, seed: int = 0) -> nn.Module:
    """Shards ``module`` in place over ``mesh`` (see the module docstring) and returns it: ``fully_shard`` on each
    unit (with activation checkpointing first, when asked), then on the whole. Its structure before sharding is
    kept, without its tensors, for ``gathered_module``.

    A module built on the meta device is materialised unit by unit (``materialise``, from ``seed``), each unit just
    before it is sharded: a process holds one unit's whole tensors at a time, never the whole model's."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import FSDPModule, fully_shard

    structure = _on_meta(module)
    policy = options.mixed_precision()
    device = torch.device(mesh.device_type)
    for name, unit in reversed(shard_units(module, options)):  # inner units first
        materialise(unit, seed, device, root=module, prefix=name)
        if options.activation_checkpointing:
            checkpoint(unit)
        fully_shard(unit, mesh=mesh, reshard_after_forward=options.reshard_after_forward, mp_policy=policy)
    materialise(module, seed, device)
    fully_shard(module, mesh=mesh, reshard_after_forward=options.reshard_after_forward, mp_policy=policy)
    for part in module.modules():
        if isinstance(part, FSDPModule):
            # The reduction sums the processes' gradients (a plain sum, which every backend has): the step divides
            # by the global batch's count.
            part.set_gradient_divide_factor(1.0)
            part.set_force_sum_reduction_for_comms(True)
    _STRUCTURES[module] = structure
    _SHARDED[module] = ShardedModule(module)
    return module


def on_meta_device(module: nn.Module) -> bool:
    """Returns whether ``module`` holds a tensor on the meta device (built under ``torch.device("meta")``)."""
    return any(tensor.is_meta for tensor in (*module.parameters(), *module.buffers()))


def materialise(
    module: nn.Module, seed: int, device: torch.device | str = "cpu", *, root: nn.Module | None = None, prefix: str = ""
) -> nn.Module:
    """Returns ``module`` with every tensor it holds on the meta device made on ``device`` and initialised, in place.

    Each tensor is made once, in every slot that holds it (ties stay ties, within ``root``: the whole model, when
    ``module`` is its part named ``prefix``). Then the submodules holding one, and those above them, are initialised
    by the model's own initialiser, innermost first: a Hugging Face model's ``_init_weights`` (rotary embeddings'
    buffers included; a block's scaled projections after the projection's own), else each one's
    ``reset_parameters``, with torch's generator seeded from ``seed`` and the submodule's qualified name, so that
    the values depend on neither the order nor the number of processes. Submodules with nothing on the meta device
    are left as they are. Raises ValueError naming a submodule holding a meta tensor that no initialiser makes."""
    import zlib

    owner = root if root is not None else module
    inside = {id(t) for t in (*module.parameters(), *module.buffers()) if t.is_meta}
    if not inside:
        return module
    initialise = getattr(owner, "_init_weights", None)
    touched = [
        (".".join(piece for piece in (prefix, name) if piece), part)
        for name, part in module.named_modules()
        if any(t.is_meta for t in (*part.parameters(), *part.buffers()))
    ]
    for qualified, part in touched:
        holds = any(t.is_meta for t in (*part.parameters(recurse=False), *part.buffers(recurse=False)))
        if holds and initialise is None and not hasattr(part, "reset_parameters"):
            raise ValueError(
                f"{type(owner).__name__}'s submodule {qualified or '(the model)'} ({type(part).__name__}) is on the "
                "meta device and has no reset_parameters to make its tensors: build it on a device, or give it one"
            )
    made: dict[int, Tensor] = {}
    for part in owner.modules():
        tables: tuple[dict[str, Any], ...] = (part._parameters, part._buffers)
        for table in tables:
            for name, tensor in table.items():
                if tensor is None or id(tensor) not in inside:
                    continue
                if id(tensor) not in made:
                    empty = torch.empty_like(tensor, device=device)
                    made[id(tensor)] = nn.Parameter(empty, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else empty
                table[name] = made[id(tensor)]
    for qualified, part in reversed(touched):  # innermost first
        holds = any(id(t) in made for t in (*part.parameters(recurse=False), *part.buffers(recurse=False)))
        if initialise is None and not (holds and hasattr(part, "reset_parameters")):
            continue
        with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []), torch.no_grad():
            torch.manual_seed((seed * 1_000_003 + zlib.crc32(qualified.encode())) % 2**63)
            if initialise is not None:
                initialise(part)
            else:
                part.reset_parameters()
    return module


def is_sharded(module: nn.Module) -> bool:
    """Returns whether ``module`` was sharded by ``shard_module``."""
    return module in _SHARDED


def gathered_module(module: nn.Module, state: State | None = None) -> nn.Module:
    """Returns a new, unsharded module of a ``shard_module``-ed ``module``'s structure holding its whole parameters
    (gathered from every process: each must call it) and buffers, in eval mode; ties stay ties. With ``state``, the
    parameters (local shards) and buffers are the state's, else the module's own."""
    sharded = _SHARDED[module]
    params = sharded.global_view(state.params) if state is not None else sharded.parameters
    buffers = state.buffers if state is not None else dict(module.named_buffers())
    return module_with(_STRUCTURES[module], {name: _whole(p) for name, p in params.items()}, dict(buffers))


def _whole(tensor: Tensor) -> Tensor:
    full = getattr(tensor, "full_tensor", None)
    return full().detach() if full is not None else tensor.detach()


def _on_meta(module: nn.Module) -> nn.Module:
    # A copy of the module whose tensors are on the meta device, made without copying a tensor's values: each
    # slot holds a meta tensor (one per tensor, so ties stay ties) while the module is copied.
    metas: dict[int, Tensor] = {}
    held: list[tuple[dict[str, Any], str, Tensor]] = []
    try:
        for owner in module.modules():
            tables: tuple[dict[str, Any], ...] = (owner._parameters, owner._buffers)
            for table in tables:
                for name, tensor in table.items():
                    if tensor is None:
                        continue
                    if id(tensor) not in metas:
                        meta = tensor.detach().to("meta")
                        metas[id(tensor)] = nn.Parameter(meta, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else meta
                    held.append((table, name, tensor))
                    table[name] = metas[id(tensor)]
        return copy.deepcopy(module)
    finally:
        for table, name, tensor in held:
            table[name] = tensor


def local_shards(module: nn.Module) -> dict[str, Tensor]:
    """Returns each parameter of a sharded ``module`` by qualified name as this process's shard: the storage its
    DTensor parameter holds, so that an update in place is the parameter's."""
    return {name: _local(p) for name, p in module.named_parameters()}


def _local(tensor: Tensor) -> Tensor:
    # Detached: the same storage, without the view's autograd history (which in-place updates would trip).
    return tensor.to_local().detach() if hasattr(tensor, "to_local") else tensor


class ShardedModule:
    """A ``shard_module``-ed module as the training and evaluation steps use it (``step.Sharded``): the step's
    parameters are this process's shards, the very storage of the module's DTensor parameters (``own``).

    Hooks from AFTER_BACKWARD to AFTER_TRAIN_BATCH see the parameters and gradients as DTensors
    (``global_view``), so that what they compute over every element (a global norm: gradient clipping, SAM) is
    computed over the whole tensors, each process holding its part.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.parameters: dict[str, Any] = dict(module.named_parameters())  # DTensors
        self.own = local_shards(module)

    @contextlib.contextmanager
    def holding(self, params: Mapping[str, Tensor]) -> Iterator[None]:
        """Runs the block with the module's parameters holding ``params`` (local shards or DTensors): those that
        are not its own storage are copied into it, and the values it held are put back after."""
        given = self.local_view(params)
        moved = [name for name, tensor in given.items() if tensor is not self.own[name]]
        if not moved:
            yield
            return
        kept = {name: self.own[name].clone() for name in moved}
        try:
            with torch.no_grad():
                for name in moved:
                    self.own[name].copy_(given[name])
            yield
        finally:
            with torch.no_grad():
                for name, value in kept.items():
                    self.own[name].copy_(value)

    def bind(self, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Returns the module's own storage after writing into it the values of ``params`` that it does not hold
        (a state whose parameters were swapped: EMA's average around an evaluation)."""
        given = self.local_view(params)
        with torch.no_grad():
            for name, tensor in given.items():
                if tensor is not self.own[name]:
                    self.own[name].copy_(tensor)
        return {**given, **self.own}

    def backward(self, objective: Tensor) -> dict[str, Tensor]:
        """Returns the local shards of the gradients of ``objective`` summed over the processes (``fully_shard``'s
        reduce-scatter, in the backward), taking them off the parameters: those it reached, as ``torch.optim``
        updates those whose ``.grad`` is set."""
        objective.backward()
        grads = {}
        for name, parameter in self.parameters.items():
            if parameter.grad is not None:
                grads[name] = _local(parameter.grad)
                parameter.grad = None
        return grads

    def global_view(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Returns ``tensors`` (local shards by parameter name) as DTensors of their parameters' layouts, sharing
        their storage."""
        from torch.distributed.tensor import DTensor

        def view(name: str, local: Tensor) -> Tensor:
            whole = self.parameters.get(name)
            if whole is None or isinstance(local, DTensor):
                return local
            return DTensor.from_local(
                local, whole.device_mesh, whole.placements, run_check=False, shape=whole.shape, stride=whole.stride()
            )

        return {name: view(name, tensor) for name, tensor in tensors.items()}

    def local_view(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Returns ``tensors`` with each DTensor as this process's shard."""
        return {name: _local(tensor) for name, tensor in tensors.items()}

    def everywhere(self, flag: Tensor) -> Tensor:
        """Returns whether the 0-d bool ``flag`` holds on every process (each must call it)."""
        import torch.distributed as dist

        failed = (~flag).to(torch.float32).reshape(1)
        dist.all_reduce(failed)
        return failed[0] == 0


def sharded_module(module: nn.Module) -> ShardedModule | None:
    """Returns the ``ShardedModule`` of a ``shard_module``-ed ``module``, None for another module."""
    return _SHARDED.get(module)


def make_sharded_step(
    module: nn.Module,
    loss_fn: Callable[[Any, Any], Tensor],
    tx: GradientTransformation,
    *,
    reduce: Callable[[Sequence[Tensor]], list[Tensor]],
    processes: int,
    input_key: int | str | None = 0,
    count: Callable[[Any], Tensor] | None = None,
    precision: Precision = "fp32",
    first_sample: int = 0,
) -> StepFn:
    """Returns the eager step ``(state, batch) -> (state, {"loss": loss, "samples": n})`` of a ``shard_module``-ed
    module, one of ``processes`` whose sums ``reduce`` takes (``distributed.all_reduce_sum``), without algorithms:
    ``make_train_step``'s, its gradient torch's backward through the sharded module (see the module docstring).

    ``state.params`` are the module's local shards (``local_shards``). The loss counts by this process's share of
    what the global batch's loss averages over (``count(batch)``: the default loss's labelled positions; else the
    samples, this process's first at ``first_sample``); the loss returned is the global batch's.
    """
    device = next(iter(module.parameters())).device
    static = Static(module=module, precision=precision, device=device)
    plan = make_plan(())
    return make_train_step(
        static, plan, loss_fn, tx, input_key=input_key, donate=True, first_sample=first_sample, reduce=reduce,
        loss_units=count, sharded=sharded_module(module),
    )  # fmt: skip


def shards_tree(state: State, module: nn.Module | None, *, weights_only: bool = False) -> dict[str, Any]:
    """Returns ``state``'s tensors as the tree a sharded checkpoint holds (``sharded_files``): the parameters, and
    the optimizer's and algorithms' tensors that are a parameter's shard (Adam's moments, EMA's and SWA's
    averages), as DTensors of a ``shard_module``-ed ``module``'s layout (each process holding its shards), every
    other tensor as it is; with ``weights_only``, the parameters and
    buffers alone. A run that is not sharded (``module`` None or unsharded) gives its whole tensors."""
    layouts: dict[str, Any] = dict(module.named_parameters()) if module is not None and is_sharded(module) else {}

    def laid_out(name: str | None, local: Any) -> Any:
        whole = layouts.get(name) if name is not None else None
        if whole is None or not isinstance(local, Tensor):
            return local
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(
            local, whole.device_mesh, whole.placements, run_check=False, shape=whole.shape, stride=whole.stride()
        )

    tree: dict[str, Any] = {
        "params": {name: laid_out(name, tensor) for name, tensor in state.params.items()},
        "buffers": dict(state.buffers),
    }
    if not weights_only:
        for kind, states in (("opt", state.opt), ("algos", state.algos)):
            paths, _ = pytree.tree_flatten_with_path(states)
            tree[kind] = {str(i): laid_out(_parameter_of(path, leaf, state.params), leaf) for i, (path, leaf) in enumerate(paths)}
        tree["hparams"] = dict(state.hparams)
        tree["step"] = state.step
        tree["key"] = state.key
    return tree


def _parameter_of(path: Sequence[Any], leaf: Any, params: Mapping[str, Tensor]) -> str | None:
    # The parameter whose shard an optimizer tensor is: keyed by its name on the way to it, and of its shape.
    for entry in path:
        name = getattr(entry, "key", None)
        if isinstance(name, str) and name in params and isinstance(leaf, Tensor) and leaf.dim():
            return name if leaf.shape == params[name].shape else None
    return None


def loaded_state(tree: dict[str, Any], template: State, *, weights_only: bool = False) -> State:
    """Returns the state a tree read from a sharded checkpoint holds, on ``template``'s structure: the tensors read
    (a DTensor's local shard), and, unless ``weights_only``, the optimizer's and algorithms' states rebuilt on
    the template's."""

    def local(value: Any) -> Any:
        return _local(value) if isinstance(value, Tensor) else value

    params = {name: local(value) for name, value in tree["params"].items()}
    buffers = {name: local(value) for name, value in tree["buffers"].items()}
    if weights_only:
        return template.replace(params=params, buffers=buffers)
    _, opt_spec = pytree.tree_flatten(template.opt)
    _, algos_spec = pytree.tree_flatten(template.algos)
    return template.replace(
        params=params,
        buffers=buffers,
        opt=pytree.tree_unflatten([local(tree["opt"][str(i)]) for i in range(len(tree["opt"]))], opt_spec),
        algos=pytree.tree_unflatten([local(tree["algos"][str(i)]) for i in range(len(tree["algos"]))], algos_spec),
        hparams=dict(tree["hparams"]),
        step=tree["step"],
        key=tree["key"],
    )


def reading_tree(template: State, module: nn.Module | None, *, weights_only: bool = False) -> dict[str, Any]:
    """Returns the tree a sharded checkpoint is read into for a run whose state is ``template``: a sharded run's
    tensors are read into its own (the module's parameters and buffers among them), in place; an unsharded run's
    into new ones of the template's shapes, dtypes and devices."""
    sharded = module is not None and is_sharded(module)

    def target(value: Any) -> Any:
        return torch.empty_like(value) if isinstance(value, Tensor) and not sharded else value

    tree = shards_tree(template, module, weights_only=weights_only)
    return {
        kind: {name: target(value) for name, value in entries.items()} if isinstance(entries, dict) else target(entries)
        for kind, entries in tree.items()
    }


def read_sharded_state(folder: str | os.PathLike[str], template: State, weights_only: bool, *, module: nn.Module | None, grouped: bool) -> State:
    """Returns the state of the sharded checkpoint in ``folder`` read into a run whose state is ``template`` and whose
    module is ``module`` (``reading_tree``): with ``grouped``, every process of the group reads its part together."""
    tree = reading_tree(template, module, weights_only=weights_only)
    read_shards(folder, tree, grouped)
    return loaded_state(tree, template, weights_only=weights_only)


class RunShards:
    """How the sharded run of ``module`` reads a checkpoint into its own shards (``checkpoint.Shards``); with ``grouped``
    every process of the group reads together."""

    def __init__(self, module: nn.Module, grouped: bool) -> None:
        self.module = module
        self.grouped = grouped

    def read(self, folder: str | os.PathLike[str], template: State, weights_only: bool) -> State:
        """Returns the state of the sharded checkpoint in ``folder`` (``read_sharded_state``)."""
        return read_sharded_state(folder, template, weights_only, module=self.module, grouped=self.grouped)

    def whole(self, template: State) -> State:
        """Returns ``template`` with the whole shapes of the tensors the run holds shards of, on the meta device."""
        tree = shards_tree(template, self.module)

        def whole(value: Any) -> Any:
            return torch.empty(value.shape, dtype=value.dtype, device="meta") if hasattr(value, "to_local") else value

        return loaded_state(
            {kind: {k: whole(v) for k, v in entries.items()} if isinstance(entries, dict) else entries for kind, entries in tree.items()},
            template,
        )

    def place(self, whole: State, template: State, weights_only: bool) -> State:
        """Returns the run's state holding this process's part of each of ``whole``'s tensors, written into the run's
        own tensors (the module's parameters and buffers among them)."""
        from torch.distributed.tensor import distribute_tensor

        targets = shards_tree(template, self.module, weights_only=weights_only)
        values = shards_tree(whole, None, weights_only=weights_only)
        with torch.no_grad():
            for kind, entries in targets.items():
                given = values[kind]
                for key, target in entries.items() if isinstance(entries, dict) else [(None, entries)]:
                    value = given[key] if key is not None else given
                    if hasattr(target, "to_local"):
                        part = distribute_tensor(value.to(target.device), target.device_mesh, target.placements, src_data_rank=None)
                        target.to_local().copy_(part.to_local())
                    elif isinstance(target, Tensor):
                        target.copy_(value)
                    elif key is not None:
                        entries[key] = value
                    else:
                        targets[kind] = value
        return loaded_state(targets, template, weights_only=weights_only)
