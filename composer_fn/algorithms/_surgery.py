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

Which layers a surgery looks for its record declares, in ``layers`` (a ``LayerKinds``): torch classes, matched
with their subclasses that keep the class's ``forward`` (a subclass that computes something else is not the same
layer), and third-party classes by module and qualified name (timm's normalisation and residual blocks), matched
without importing their library. ``target_modules`` on every surgery restricts it to modules by name.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import inspect
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm, Capabilities, ChangesNothing, HostHook
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static
from composer_fn.core.time import Timestamp

__all__ = [
    "Surgery",
    "LayerKinds",
    "Withheld",
    "module_with_tensors",
    "module_tensors",
    "replace_modules",
    "warn_nothing_to_replace",
    "replaced",
    "matching_modules",
    "surgery_key",
    "check_model",
    "tied_names",
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
    its weight (see ``composer_fn.nn.shared_copy``), and tied weights stay tied.
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
    """Warns (``ChangesNothing`` about ``method``, the surgery's class name) that the surgery found none of
    ``looks_for`` in ``model`` to replace.

    Every surgery says so the same way when a model has neither the layers it looks for nor layers it already
    rewrote; the model comes back as an unchanged copy.
    """
    warnings.warn(
        ChangesNothing(f"{method} found no {looks_for} in {type(model).__name__}, so it changes nothing", method),
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


@dataclass(frozen=True)
class LayerKinds:
    """The layers a surgery rewrites: ``torch_classes`` and ``third_party`` classes by ``module.qualname``.

    A module is of these kinds when one of its classes (its own or a base) is named in ``third_party`` (compared
    by name, so their library is never imported), or when it is an instance of one of ``torch_classes`` and
    ``subclasses`` allows its class: ``"same forward"`` (the default) admits the class and its subclasses that
    keep the class's ``forward`` (``GhostBatchNorm2d``, which normalises differently, is not a plain
    ``BatchNorm2d``); ``"any"`` every subclass (a surgery that wraps the layer as it is); ``"none"`` the class
    itself only (a surgery whose replacement others reach into, such as attention's ``out_proj``).
    """

    torch_classes: tuple[type[nn.Module], ...] = ()
    third_party: tuple[str, ...] = ()
    subclasses: Literal["same forward", "any", "none"] = "same forward"

    def kind(self, module: object) -> str | None:
        """Returns the ``module.qualname`` of the declared class ``module`` is, or None when it is none of them."""
        for cls in type(module).__mro__:
            name = f"{cls.__module__}.{cls.__qualname__}"
            if name in self.third_party:
                return name
        for declared in self.torch_classes:
            if not isinstance(module, declared):
                continue
            if self.subclasses == "any" or type(module) is declared:
                return f"{declared.__module__}.{declared.__qualname__}"
            if self.subclasses == "same forward" and getattr(type(module), "forward", None) is declared.forward:
                return f"{declared.__module__}.{declared.__qualname__}"
        return None

    def describe(self) -> str:
        """Returns the declared classes as a sentence fragment for messages."""
        names = [f"torch.nn.{c.__qualname__}" for c in self.torch_classes]
        return " or ".join([*names, *self.third_party])


class Withheld(nn.Module):
    """Stands in for a submodule that a surgery restricted by ``target_modules`` leaves alone.

    The module is held outside ``_modules``, so the surgery's search does not see it; it computes what the
    module does. ``Surgery`` puts the module back once the rewrite is done.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.__dict__["withheld"] = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Returns the withheld module's output."""
        return self.__dict__["withheld"](*args, **kwargs)


def _ancestry(name: str) -> Iterator[str]:
    parts = name.split(".")
    return (".".join(parts[: i + 1]) for i in range(len(parts)))


def _checked_patterns(patterns: object) -> tuple[str, ...]:
    if isinstance(patterns, str) or not isinstance(patterns, tuple | list):
        raise TypeError(
            f"target_modules={patterns!r} must be a tuple of module-name patterns (fnmatch, e.g. ('layer3.*',))"
        )
    if not all(isinstance(p, str) and p for p in patterns):
        raise TypeError(f"target_modules={patterns!r} must hold non-empty strings (fnmatch patterns)")
    return tuple(patterns)


def surgery_key(state_key: Tensor, name: str) -> Tensor:
    """Returns the key that the surgery named ``name`` draws new parameters from, derived from the run's key."""
    return R.fold_in(state_key, R.name_to_int(f"surgery/{name}"))


@dataclass(frozen=True)
class Surgery(Algorithm):
    """Base record of model-surgery algorithms: a pure rewrite of the model at INIT (see the module docstring).

    Args:
        target_modules: restricts the surgery to the modules whose qualified name, or the name of a module
            holding them, matches one of these ``fnmatch`` patterns (``('layer3', 'layer4.*.conv1')``); empty:
            every module the surgery looks for. A pattern that matches no module of the model is refused.
    """

    target_modules: tuple[str, ...] = field(default=(), kw_only=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__post_init__")
        if own is not None and not getattr(own, "_checks_target_modules", False):
            # Every surgery's record checks target_modules, whether or not its own __post_init__ asks for it.
            @functools.wraps(own)
            def __post_init__(self: Surgery) -> None:
                Surgery.__post_init__(self)
                own(self)

            __post_init__._checks_target_modules = True  # type: ignore[attr-defined]
            cls.__post_init__ = __post_init__  # type: ignore[method-assign]

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", _checked_patterns(self.target_modules))

    def targets(self, module: nn.Module) -> frozenset[str]:
        """Returns the qualified names of the submodules ``rewrite`` would replace (empty once applied)."""
        raise NotImplementedError

    def rewrite(self, module: nn.Module, key: Tensor) -> nn.Module:
        """Returns the rewritten model, a new module; ``module`` is untouched. New layers draw from ``key``."""
        raise NotImplementedError

    def rewrite_at(self, module: nn.Module, key: Tensor, timestamp: Timestamp) -> nn.Module:
        """Returns ``rewrite(module, key)``; a surgery whose layers depend on the run (its length) overrides this."""
        return self.rewrite(module, key)

    rewrites_after: ClassVar[frozenset[str]] = frozenset()
    """Names of the surgeries whose rewritten modules this one rewrites further (see ``Capabilities``)."""

    layers: ClassVar[LayerKinds | None] = None
    """The layers it looks for, its one declaration (``BlurPool``: ``torch.nn.Conv2d`` and ``torch.nn.MaxPool2d``);
    None for a surgery that finds what it rewrites by another rule (ALiBi's attention, the transformer blocks of
    GatedLinearUnits) or declares several kinds under names of its own (StochasticDepth's ``blocks``). A
    third-party entry is a class whose computation the surgery's replacement reproduces."""

    def capabilities(self) -> Capabilities:
        return Capabilities(rewrites=self.surgery_targets, rewrites_after=self.rewrites_after)

    def surgery_targets(self, module: object) -> frozenset[str]:
        """Returns ``targets(module)`` restricted by ``target_modules`` for a module, and nothing for anything else.

        Raises ValueError naming a pattern of ``target_modules`` that matches no module of ``module``.
        """
        if not isinstance(module, nn.Module):
            return frozenset()
        return self._selected(module, self.targets(module))

    def _selected(self, module: nn.Module, names: frozenset[str]) -> frozenset[str]:
        patterns = self.target_modules
        if not patterns:
            return names
        modules = [name for name, _ in module.named_modules() if name]
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in modules):
                shown = ", ".join(modules[:6]) + (", ..." if len(modules) > 6 else "")
                raise ValueError(
                    f"{type(self).__name__}(target_modules={patterns!r}): the pattern {pattern!r} matches no module "
                    f"of {type(module).__name__}, whose modules are named like {shown}"
                )
        return frozenset(
            name
            for name in names
            if any(fnmatch.fnmatchcase(part, pattern) for part in _ancestry(name) for pattern in patterns)
        )

    def _restricted_rewrite(self, module: nn.Module, key: Tensor, timestamp: Timestamp) -> nn.Module:
        if not self.target_modules:
            return self.rewrite_at(module, key, timestamp)
        # The targets left alone are withheld from the rewrite (it cannot see them), then put back as they were.
        everything = self.targets(module)
        left_alone = sorted(everything - self._selected(module, everything))
        hidden = copy.deepcopy(module)
        for name in left_alone:
            owner_path, _, attribute = name.rpartition(".")
            owner = hidden.get_submodule(owner_path)
            owner._modules[attribute] = Withheld(owner._modules[attribute])  # type: ignore[arg-type]
        rewritten = self.rewrite_at(hidden, key, timestamp)
        slots = [
            (owner, attribute, child)
            for owner in rewritten.modules()
            for attribute, child in owner._modules.items()
            if isinstance(child, Withheld)
        ]
        for owner, attribute, child in slots:
            owner._modules[attribute] = child.__dict__["withheld"]
        return rewritten

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {Event.INIT: self._operate}

    def _operate(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        current = module_with_tensors(static.module, state.params, state.buffers)
        with torch.no_grad():
            rewritten = self._restricted_rewrite(current, surgery_key(state.key, self.name), timestamp)
        rewritten = rewritten.to(static.device)
        _check_ties(self, current, rewritten)
        _check_direct_reads(self, current, rewritten)
        params, buffers = module_tensors(rewritten)
        return static.replace(module=rewritten), state.replace(params=params, buffers=buffers)


def tied_names(module: nn.Module) -> list[tuple[str, ...]]:
    """Returns the groups of names under which ``module`` registers one parameter or buffer (tied weights: a
    language model's output layer and its input embedding), each group in ``named_parameters()`` order."""
    groups: dict[int, list[str]] = {}
    for members in (module.named_parameters, module.named_buffers):
        for name, tensor in members(remove_duplicate=False):
            groups.setdefault(id(tensor), []).append(name)
    return [tuple(names) for names in groups.values() if len(names) > 1]


def _check_ties(surgery: Surgery, before: nn.Module, after: nn.Module) -> None:
    # A rewrite that replaces the layer on one side of a tie (factorizing a language model's output layer, whose
    # weight is its embedding's) would train two tensors where the model had one: refused, naming the fix. A tie
    # whose names all went (a module registered twice, replaced under both) or that moved with its layer (a
    # wrapped layer's weight under a new name) is kept.
    holders: dict[int, list[str]] = {}
    present: dict[str, int] = {}
    for members in (after.named_parameters, after.named_buffers):
        for name, tensor in members(remove_duplicate=False):
            present[name] = id(tensor)
            holders.setdefault(id(tensor), []).append(name)
    for names in tied_names(before):
        kept = [name for name in names if name in present]
        tensors = {present[name] for name in kept}
        if not kept or (len(tensors) == 1 and len(holders[tensors.pop()]) >= len(names)):
            continue
        gone = [name for name in names if name not in kept] or names[1:]
        owners = sorted({name.rpartition(".")[0] or name for name in gone})
        raise ValueError(
            f"{type(surgery).__name__} would rewrite {', '.join(map(repr, owners))}, whose tensor "
            f"{names[0]!r} is tied to {', '.join(map(repr, names[1:]))} (one tensor under {len(names)} names): "
            f"the rewritten model would train them apart; leave the layer out, e.g. "
            f"{type(surgery).__name__}(target_modules=...) naming the other layers"
        )


_CONSTRUCTION = frozenset({"__init__", "reset_parameters", "_reset_parameters", "init_weights", "_init_weights", "extra_repr"})
"""Methods that run when a module is built or printed, not in training: what they read does not matter here."""


def _check_direct_reads(surgery: Surgery, before: nn.Module, after: nn.Module) -> None:
    # A module that reads a child's tensor itself rather than calling the child (torchvision's Swin attention hands
    # self.qkv.weight to a function) would find no such tensor on a replacement that holds other ones (a
    # factorized layer's two factors) and fail inside its own code at the first forward: refused now, naming the
    # reader and the fix.
    rewritten = dict(after.named_modules(remove_duplicate=False))
    for name, old in before.named_modules(remove_duplicate=False):
        new = rewritten.get(name)
        if not name or new is None or type(new) is type(old):
            continue
        lost = tuple(t for t in (*old._parameters, *old._buffers) if not isinstance(getattr(new, t, None), Tensor))
        owner_path, _, attribute = name.rpartition(".")
        owner = before.get_submodule(owner_path)
        read = _direct_read(type(owner), attribute, lost) if lost else None  # type: ignore[arg-type]  # classes hash
        if read is None:
            continue
        method, tensor = read
        raise ValueError(
            f"{type(surgery).__name__} would replace {name!r} ({type(old).__name__}) by a "
            f"{type(new).__name__}, but {type(owner).__name__}.{method}() reads self.{attribute}.{tensor} itself "
            f"instead of calling the layer, and the replacement holds no {tensor!r}: the model would fail inside "
            f"{type(owner).__module__}. Leave the layer out, e.g. {type(surgery).__name__}(target_modules=...) "
            "naming the other layers"
        )


@functools.cache
def _direct_read(owner: type[nn.Module], attribute: str, tensors: tuple[str, ...]) -> tuple[str, str] | None:
    # The first method of ``owner``'s class (or a base class below nn.Module) whose source reads
    # ``self.<attribute>.<tensor>``, with that tensor; None when none does or no source can be read.
    pattern = re.compile(rf"\bself\.{re.escape(attribute)}\.({'|'.join(map(re.escape, tensors))})\b")
    for klass in owner.__mro__:
        if klass is nn.Module or not issubclass(klass, nn.Module):
            break
        for method, function in vars(klass).items():
            if method in _CONSTRUCTION or not inspect.isfunction(function):
                continue
            try:
                source = inspect.getsource(function)
            except (OSError, TypeError):
                continue
            found = pattern.search(source)
            if found:
                return method, found.group(1)
    return None
