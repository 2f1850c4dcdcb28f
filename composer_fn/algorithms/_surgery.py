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
    "matching_modules",
    "surgery_key",
]


def module_with_tensors(module: nn.Module, params: Mapping[str, Tensor], buffers: Mapping[str, Tensor]) -> nn.Module:
    """Returns a deep copy of ``module`` holding clones of ``params`` and ``buffers`` by qualified name.

    Names the mappings do not hold keep the copy's own tensors; ``module`` and the mappings are untouched.
    """
    copied = copy.deepcopy(module)
    for name, tensor in params.items():
        owner_path, _, attribute = name.rpartition(".")
        owner = copied.get_submodule(owner_path)
        owner._parameters[attribute] = nn.Parameter(tensor.detach().clone(), requires_grad=True)
    for name, tensor in buffers.items():
        owner_path, _, attribute = name.rpartition(".")
        owner = copied.get_submodule(owner_path)
        owner._buffers[attribute] = tensor.detach().clone()
    return copied


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

    The replacement modules are placed as given (not copied); build them from the copy's own submodules or
    as fresh modules.
    """
    copied = copy.deepcopy(module)
    for name, replacement in replacements.items():
        if not name:
            raise ValueError("replace_modules cannot replace the root module (name '')")
        owner_path, _, attribute = name.rpartition(".")
        owner = copied.get_submodule(owner_path)
        if attribute not in owner._modules:
            raise ValueError(f"module has no submodule {name!r} to replace")
        owner._modules[attribute] = replacement
    return copied


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
