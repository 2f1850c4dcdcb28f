"""The project's metadata builds without deprecation warnings and installs what ``make docs`` needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parents[2]


def project() -> dict[str, Any]:
    """Returns the ``[project]`` table of pyproject.toml."""
    table: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return table


def test_the_license_is_an_spdx_expression() -> None:
    # A table (``{ text = ... }``) is deprecated by setuptools and warns at every build.
    assert project()["license"] == "Apache-2.0"


def test_the_development_install_has_the_documentation_tools_and_the_models_users_bring() -> None:
    extras = project()["optional-dependencies"]
    assert any(requirement.startswith("mkdocstrings[python]") for requirement in extras["docs"])
    assert any(requirement.startswith("transformers") for requirement in extras["hf"])
    assert any(requirement.startswith("timm") for requirement in extras["timm"])
    assert any(requirement.startswith("wandb") for requirement in extras["wandb"])
    assert any(requirement.startswith("mlflow") for requirement in extras["mlflow"])
    own = [r for r in extras["dev"] if r.startswith("composer_fn[")]
    assert own and {"docs", "hf", "timm", "wandb", "mlflow"} <= set(own[0][len("composer_fn[") : -1].split(","))
