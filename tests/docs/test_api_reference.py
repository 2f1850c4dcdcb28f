"""The API reference is complete: every public name has a docstring, a page renders it, and the site builds.

A name is public when its module lists it in ``__all__`` (every public module has one), a module is public when
no part of its dotted name starts with an underscore, and a method is public when its own name does not. The
reference's pages (``docs/reference/*.md``) render the public modules with mkdocstrings.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import composer_fn

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def public_modules() -> list[str]:
    """Returns the dotted names of the package's public modules: no part of the name starts with ``_``."""
    names = [
        info.name
        for info in pkgutil.walk_packages(composer_fn.__path__, prefix="composer_fn.")
        if not any(part.startswith("_") for part in info.name.split("."))
    ]
    return sorted(names)


def defined_here(obj: Any) -> bool:
    """Returns whether ``obj`` is a class or function this package defines with ``class`` or ``def``.

    A re-exported torch or typing name is not; nor is a function another function made (a checker built by a
    factory), which is a value documented where it is assigned.
    """
    return (
        (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", "").startswith("composer_fn")
        and "<locals>" not in obj.__qualname__
    )


def own_docstring(obj: Any) -> str | None:
    """Returns the docstring written on ``obj`` itself: not one a base class, dataclass or NamedTuple made up."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    if not doc or not doc.strip():
        return None
    if inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("):
        return None  # dataclasses and NamedTuples write their signature as the docstring
    return str(doc)


def documented_in_a_base(cls: type, name: str) -> bool:
    """Returns whether a base class of this package documents the method ``name`` that ``cls`` overrides."""
    for base in cls.__mro__[1:]:
        if base.__module__.startswith("composer_fn") and name in vars(base):
            attribute = vars(base)[name]
            function = getattr(attribute, "__func__", attribute)
            if getattr(function, "__doc__", None):
                return True
    return False


def undocumented_methods(cls: type) -> list[str]:
    """Returns the public methods and properties ``cls`` defines that have no docstring, their own or a base's."""
    fields = getattr(cls, "__dataclass_fields__", {})
    missing = []
    for name, attribute in vars(cls).items():
        if name.startswith("_") or name in fields:
            continue
        if isinstance(attribute, property):
            documented = bool(attribute.__doc__)
        elif isinstance(attribute, staticmethod | classmethod) or inspect.isfunction(attribute):
            documented = bool(getattr(attribute, "__func__", attribute).__doc__)
        else:
            continue
        if not documented and not documented_in_a_base(cls, name):
            missing.append(name)
    return missing


def exported(module: ModuleType) -> list[tuple[str, Any]]:
    """Returns the module's public names with their values, in ``__all__`` order."""
    return [(name, getattr(module, name)) for name in module.__all__]


def test_every_public_module_lists_its_public_names() -> None:
    modules = [name for name in public_modules() if not hasattr(importlib.import_module(name), "__all__")]
    # The top-level package computes its ``__all__`` on first use; ``core`` is a namespace of modules.
    assert set(modules) <= {"composer_fn.__main__", "composer_fn.core"}, modules


def test_every_public_class_function_and_method_has_a_docstring() -> None:
    missing: list[str] = []
    seen: set[int] = set()
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name, obj in exported(module) if hasattr(module, "__all__") else []:
            if not defined_here(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if own_docstring(obj) is None:
                missing.append(f"{module_name}.{name}")
            if inspect.isclass(obj):
                missing += [f"{module_name}.{name}.{method}" for method in undocumented_methods(obj)]
    assert not missing, f"public names without a docstring: {', '.join(missing)}"


def test_the_top_level_names_have_docstrings() -> None:
    missing = [name for name in composer_fn.__all__ if own_docstring(getattr(composer_fn, name)) is None]
    assert not missing, missing


def rendered_modules() -> set[str]:
    """Returns the modules the reference's pages render (``::: composer_fn.x`` lines)."""
    pages = "\n".join(page.read_text() for page in REFERENCE.glob("*.md"))
    return set(re.findall(r"^::: (composer_fn[\w.]*)$", pages, flags=re.MULTILINE))


def test_every_public_package_has_a_reference_page() -> None:
    packages = {name for name in public_modules() if name.count(".") == 1 and name != "composer_fn.__main__"}
    assert packages - rendered_modules() == set()


def args_section(docstring: str) -> set[str]:
    """Returns the parameter names a Google-style ``Args:`` section documents."""
    section = re.search(r"^Args:\n((?:    .*\n|\n)+)", docstring + "\n", flags=re.MULTILINE)
    assert section, "the docstring has no Args: section"
    return set(re.findall(r"^    (\*{0,2}\w+)(?: \([^)]*\))?:", section.group(1), flags=re.MULTILINE))


def test_every_trainer_argument_is_in_its_args_section() -> None:
    from composer_fn import Trainer

    parameters = [name for name in inspect.signature(Trainer.__init__).parameters if name != "self"]
    documented = args_section(inspect.getdoc(Trainer) or "")
    assert [name for name in parameters if name not in documented] == []
    assert documented - set(parameters) == set(), "the Args section documents arguments Trainer does not take"


def test_mkdocs_builds_the_reference_with_warnings_as_errors(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' to build the reference")
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    trainer_page = (tmp_path / "site" / "reference" / "trainer" / "index.html").read_text()
    for name in inspect.signature(composer_fn.Trainer.__init__).parameters:
        if name != "self":
            assert f"<code>{name}</code>" in trainer_page, f"the Trainer page does not list {name}"
