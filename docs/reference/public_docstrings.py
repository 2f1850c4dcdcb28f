"""A griffe extension: warns about every public class, function and method of ``composer_fn`` without a docstring.

``mkdocs build --strict`` turns the warnings into a failed build. A name is public when its module lists it in
``__all__`` (or, in a module without ``__all__``, when it has no leading underscore and is not imported); a
method is public when its name has no leading underscore. An override without a docstring of its own takes its
base's (the ``griffe_inherited_docstrings`` extension, which runs first).
"""

from __future__ import annotations

from typing import Any

import griffe


def _public_modules(module: griffe.Module) -> list[griffe.Module]:
    modules = [module]
    for name, member in module.members.items():
        if not member.is_alias and member.is_module and not name.startswith("_"):
            modules.extend(_public_modules(member))  # type: ignore[arg-type]
    return modules


def _target(member: griffe.Object | griffe.Alias) -> griffe.Object | None:
    if not member.is_alias:
        return member  # type: ignore[return-value]
    try:
        target = member.final_target  # type: ignore[union-attr]
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    return target if target.path.startswith("composer_fn.") else None


class PublicDocstrings(griffe.Extension):
    """Warns, through griffe's logger, about each public object of the package that has no docstring."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Checks every public module of ``pkg`` once the whole package is loaded."""
        seen: set[str] = set()
        for module in _public_modules(pkg):
            for member in module.members.values():
                if not member.is_public:
                    continue
                target = _target(member)
                if target is None or target.path in seen or not (target.is_class or target.is_function):
                    continue
                seen.add(target.path)
                self._check(target, f"{module.path}.{member.name}")
                if target.is_class:
                    for name, method in target.members.items():
                        if not name.startswith("_") and isinstance(method, griffe.Function):
                            self._check(method, f"{module.path}.{member.name}.{name}")

    @staticmethod
    def _check(target: griffe.Object, public_path: str) -> None:
        """Warns when ``target``, public as ``public_path``, has no docstring."""
        if target.docstring is None or not target.docstring.value.strip():
            location = f"{target.relative_filepath}:{target.lineno}"
            griffe.logger.warning(f"{location}: {public_path} is public and has no docstring")
