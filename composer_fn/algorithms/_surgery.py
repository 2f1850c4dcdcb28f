"""Model surgery as pure functions: a rewrite returns a new module and never edits the one it is given.

A surgery algorithm subclasses ``Surgery`` and implements two methods:

- ``targets(module)``: the qualified names of the submodules it would replace (empty once it has been applied,
  which makes it idempotent); the trainer refuses, before anything runs, two surgeries that claim the same
  submodule;
- ``rewrite(module, key)``: the new module, built from a private copy of ``module``. New layers draw their
  initial values from ``key`` (``init_parameters``), never from PyTorch's global generator.

``Surgery`` supplies the INIT host hook: it loads the state's current tensors into a copy of the structure,
rewrites it, and returns a new ``Static`` and a ``State`` whose params and buffers are the new module's.
Tensors of submodules the rewrite keeps are carried over unchanged (same values, dtype and memory format).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm, Capabilities, HostHook
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static
from composer_fn.core.time import Timestamp

__all__ = [
    "Surgery",
    "module_with_tensors",
    "module_tensors",
    "replace_modules",
    "shared_copy",
    "warn_nothing_to_replace",
    "replaced",
    "matching_modules",
    "surgery_key",
    "check_model",
]


def check_model(model: object, argument: str = "model") -> nn.Module:
    """Returns ``model`` if it is a ``torch.nn.Module``; raises TypeError naming ``argument`` otherwise."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"{argument} of type {type(model).__name__}: expected a torch.nn.Module")
    return model


def module_with_tensors(
    module: nn.Module, params: Mapping[str, Tensor], buffers: Mapping[str, Tensor]
) -> nn.Module:
    """Returns a deep copy of ``module`` holding clones of ``params`` and ``buffers`` by qualified name.

    Names the mappings do not hold keep the copy's own tensors; ``module`` and the mappings are untouched. A
    tensor registered under several names (tied weights, a module registered twice) stays one tensor: the
    value given for any of its names goes to all of them.
    """
    copied = copy.deepcopy(module)
    slots = _tensor_slots(copied)
    for name, tensor in params.items():
        new = nn.Parameter(tensor.detach().clone(), requires_grad=True)
        for owner, attribute in slots[id(copied.get_parameter(name))]:
            owner._parameters[attribute] = new
    for name, tensor in buffers.items():
        new_buffer = tensor.detach().clone()
        for owner, attribute in slots[id(copied.get_buffer(name))]:
            owner._buffers[attribute] = new_buffer
    return copied


def _tensor_slots(module: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    # Every (owner, attribute) holding each parameter or buffer, by the tensor's id; each owner visited once.
    slots: dict[int, list[tuple[nn.Module, str]]] = {}
    for owner in module.modules():
        for attribute, tensor in [*owner._parameters.items(), *owner._buffers.items()]:
            if tensor is not None:
                slots.setdefault(id(tensor), []).append((owner, attribute))
    return slots


def shared_copy(module: nn.Module) -> nn.Module:
    """Returns a copy of ``module``'s structure that holds ``module``'s own parameters and buffers (not copies).

    For building replacements: ``replace_modules`` moves the tensors of its input that a replacement holds
    onto its copy, so a replacement made of ``shared_copy`` parts keeps every tie its layer had.
    """
    memo: dict[int, object] = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return copy.deepcopy(module, memo)


def module_tensors(module: nn.Module) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Returns detached clones of ``module``'s parameters and buffers by qualified name."""
    params = {name: p.detach().clone() for name, p in module.named_parameters()}
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    return params, buffers


def matching_modules(module: nn.Module, predicate: Callable[[str, nn.Module], bool]) -> Iterator[str]:
    """Yields the qualified names of ``module``'s submodules (not ``module`` itself) for which ``predicate`` holds.

    A match's own submodules are not searched: replacing a module replaces everything inside it.
    """
    skip: list[str] = []
    for name, child in module.named_modules():
        if not name or any(name.startswith(prefix + ".") for prefix in skip):
            continue
        if predicate(name, child):
            skip.append(name)
            yield name


def replace_modules(module: nn.Module, replacements: Mapping[str, nn.Module]) -> nn.Module:
    """Returns a deep copy of ``module`` with the submodule at each qualified name replaced; ``module`` is untouched.

    A submodule registered under several names is replaced under all of them, so nothing of it stays behind.
    The replacement modules are placed as given (not copied), except that the modules, parameters and buffers
    of ``module`` they hold are swapped for the copy's: a replacement may wrap the layer it replaces, or share
    its weight (see ``shared_copy``), and tied weights stay tied.
    """
    memo: dict[int, object] = {}
    copied = copy.deepcopy(module, memo)
    originals: dict[int, nn.Module] = {}
    for name, replacement in replacements.items():
        if not name:
            raise ValueError("replace_modules cannot replace the root module (name '')")
        owner_path, _, attribute = name.rpartition(".")
        owner = copied.get_submodule(owner_path)
        if attribute not in owner._modules:
            raise ValueError(f"module has no submodule {name!r} to replace")
        target = owner._modules[attribute]
        if target is None:
            # An empty slot (a layer the model may hold) is no other slot's module: fill it alone.
            owner._modules[attribute] = _onto_copy(replacement, memo)
        else:
            originals[id(target)] = _onto_copy(replacement, memo)
    # Every slot is found before any is filled: a replacement may hold the module it replaces.
    slots = [
        (owner, attribute, originals[id(child)])
        for owner in copied.modules()
        for attribute, child in owner._modules.items()
        if child is not None and id(child) in originals
    ]
    for owner, attribute, replacement in slots:
        owner._modules[attribute] = replacement
    return copied


def _onto_copy(replacement: nn.Module, memo: Mapping[int, object]) -> nn.Module:
    # The copy's twin of anything the replacement took from the input module; everything else as it is.
    twin = memo.get(id(replacement))
    if isinstance(twin, nn.Module):
        return twin
    seen: set[int] = set()
    stack = [replacement]
    while stack:
        owner = stack.pop()
        if id(owner) in seen:
            continue
        seen.add(id(owner))
        for attribute, parameter in owner._parameters.items():
            twin = memo.get(id(parameter)) if parameter is not None else None
            if isinstance(twin, nn.Parameter):
                owner._parameters[attribute] = twin
        for attribute, buffer in owner._buffers.items():
            twin = memo.get(id(buffer)) if buffer is not None else None
            if isinstance(twin, Tensor):
                owner._buffers[attribute] = twin
        for attribute, child in owner._modules.items():
            twin = memo.get(id(child)) if child is not None else None
            if isinstance(twin, nn.Module):
                owner._modules[attribute] = twin
            elif child is not None:
                stack.append(child)
    return replacement


def warn_nothing_to_replace(method: str, looks_for: str, model: nn.Module, *, stacklevel: int = 3) -> None:
    """Warns (``UserWarning``) that the surgery ``method`` found none of ``looks_for`` in ``model`` to replace.

    Every surgery says so the same way when a model has neither the layers it looks for nor layers it already
    rewrote; the model comes back as an unchanged copy.
    """
    warnings.warn(
        f"{method} found no {looks_for} in {type(model).__name__}, so it changes nothing",
        UserWarning,
        stacklevel=stacklevel,
    )


def replaced(
    model: nn.Module,
    replacements: Mapping[str, nn.Module],
    *,
    method: str,
    looks_for: str,
    rewritten: type | tuple[type, ...],
    stacklevel: int = 4,
) -> nn.Module:
    """Returns ``replace_modules(model, replacements)``; with nothing to replace and no ``rewritten`` layer in
    ``model`` (the surgery was not applied before), warns as ``warn_nothing_to_replace`` first."""
    if not replacements and not any(isinstance(m, rewritten) for m in model.modules()):
        warn_nothing_to_replace(method, looks_for, model, stacklevel=stacklevel)
    return replace_modules(model, replacements)


def surgery_key(state_key: Tensor, name: str) -> Tensor:
    """Returns the key that the surgery named ``name`` draws new parameters from, derived from the run's key."""
    return R.fold_in(state_key, R.name_to_int(f"surgery/{name}"))


@dataclass(frozen=True)
class Surgery(Algorithm):
    """Base record of model-surgery algorithms: a pure rewrite of the model at INIT (see the module docstring)."""

    def targets(self, module: nn.Module) -> frozenset[str]:
        """Returns the qualified names of the submodules ``rewrite`` would replace (empty once applied)."""
        raise NotImplementedError

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        """Returns the rewritten model, a new module; ``module`` is untouched. New layers draw from ``key``."""
        raise NotImplementedError

    def rewrite_at(self, module: nn.Module, key: Tensor, timestamp: Timestamp) -> nn.Module:
        """Returns ``rewrite(module, key)``; a surgery whose layers depend on the run (its length) overrides this."""
        return self.rewrite(module, key)

    def capabilities(self) -> Capabilities:
        return Capabilities(rewrites=self.surgery_targets)

    def surgery_targets(self, module: object) -> frozenset[str]:
        """Returns ``targets(module)`` for a module, and nothing for anything else."""
        if not isinstance(module, nn.Module):
            return frozenset()
        return self.targets(module)

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {Event.INIT: self._operate}

    def _operate(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        current = module_with_tensors(static.module, state.params, state.buffers)
        with torch.no_grad():
            rewritten = self.rewrite_at(current, surgery_key(state.key, self.name), timestamp)
        rewritten = rewritten.to(static.device)
        params, buffers = module_tensors(rewritten)
        return static.replace(module=rewritten), state.replace(params=params, buffers=buffers)
