"""How to install an optional extra: the one command each missing-package error gives."""

from __future__ import annotations

__all__ = ["EXTRAS", "install_command"]

EXTRAS = ("export", "hf", "timm", "wandb", "mlflow", "s3", "datasets", "docs", "dev")
"""The optional extras the project declares (``pyproject.toml``'s ``optional-dependencies``)."""


def install_command(extra: str) -> str:
    """Returns the command that installs the optional extra ``extra`` into the environment running the project, as
    it is installed from its source checkout (``make demo`` and ``make test`` install it so)."""
    if extra not in EXTRAS:
        raise ValueError(f"extra={extra!r} is not one of the project's extras: {', '.join(EXTRAS)}")
    return f"pip install -e '.[{extra}]' in the composer_fn checkout (from a built package: pip install 'composer_fn[{extra}]')"
