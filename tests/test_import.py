"""Importing the package and asking the command for help load only what they use.

Each check runs a fresh interpreter, since this process has long since imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from composer_fn.core.random import name_to_int

LOADED_ON_FIRST_USE = ("torch._dynamo", "scipy", "torchmetrics", "torchvision")


def modules_after(code: str) -> set[str]:
    """Returns the names in ``sys.modules`` after a fresh interpreter runs ``code``."""
    report = "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    finished = subprocess.run(
        [sys.executable, "-c", code + report], capture_output=True, text=True, timeout=300, check=True
    )
    return set(json.loads(finished.stdout.splitlines()[-1]))


def loaded(modules: set[str], package: str) -> bool:
    return package in modules or any(name.startswith(package + ".") for name in modules)


def test_the_whole_public_surface_loads_no_compiler_metrics_scipy_or_torchvision() -> None:
    modules = modules_after("import composer_fn\nfrom composer_fn import *\nfrom composer_fn import functional, optim")
    assert "torch" in modules and "composer_fn.trainer" in modules
    assert [package for package in LOADED_ON_FIRST_USE if loaded(modules, package)] == []


@pytest.mark.parametrize(
    "code",
    [
        # `python -m composer_fn --help`
        "import runpy, sys\nsys.argv = ['composer-fn', '--help']\n"
        "try:\n    runpy.run_module('composer_fn', run_name='__main__')\nexcept SystemExit:\n    pass",
        # the `composer-fn` console script, `composer_fn.app.cli:main`
        "from composer_fn.app.cli import main\n"
        "for argv in (['--help'], ['train', '--help'], ['plan', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass",
    ],
    ids=["python -m composer_fn", "composer-fn"],
)
def test_the_command_answers_help_without_importing_torch(code: str) -> None:
    assert not loaded(modules_after(code), "torch")


def test_every_public_name_is_the_object_its_module_defines() -> None:
    code = (
        "import importlib\n"
        "from composer_fn.core.dry_run import dry_run\n"  # its module first: the public name is the function
        "import composer_fn\n"
        "assert composer_fn.dry_run is dry_run\n"
        "assert set(composer_fn.algorithms.__all__) <= set(composer_fn.__all__)\n"
        "for name in composer_fn.__all__:\n"
        "    module = composer_fn._MODULES.get(name) or composer_fn._ORIGINS.get(name, 'composer_fn.algorithms')\n"
        "    expected = importlib.import_module(module)\n"
        "    expected = expected if name in composer_fn._MODULES else getattr(expected, name)\n"
        "    assert getattr(composer_fn, name) is expected, name\n"
        "assert set(composer_fn.__all__) <= set(dir(composer_fn))\n"
        "assert composer_fn.models.MLP is importlib.import_module('composer_fn.models').MLP\n"
    )
    assert "composer_fn.algorithms" in modules_after(code)


def test_name_to_int_carries_the_mark_of_assume_constant_result() -> None:
    # Traced code must take name_to_int's value rather than trace its loop over bytes.
    marked = torch.compiler.assume_constant_result(lambda name: 0)
    marks = {attribute: value for attribute, value in vars(marked).items() if attribute.startswith("_dynamo")}
    assert marks
    assert {attribute: getattr(name_to_int, attribute, None) for attribute in marks} == marks


def test_the_trainer_registers_every_algorithm_that_a_checkpoint_may_name() -> None:
    code = (
        "from composer_fn import Trainer\n"
        "from composer_fn.core.algorithm import REGISTRY\n"
        "registered = len(REGISTRY)\n"
        "import composer_fn.algorithms\n"
        "assert registered == len(composer_fn.algorithms.__all__) == len(REGISTRY), registered\n"
    )
    assert "composer_fn.trainer" in modules_after(code)


def test_the_trainer_loads_no_algorithm_until_it_reads_a_checkpoint_that_names_them() -> None:
    stored = Path(__file__).parent / "trainer" / "checkpoints" / "digits-blurpool-ema-adamw-ep0-ba6.pt"
    code = (
        "import sys\n"
        "from composer_fn.trainer import Trainer, load_model\n"
        "from composer_fn.models import SmallCNN\n"
        "assert not [name for name in sys.modules if name.startswith('composer_fn.algorithms')]\n"
        f"model = load_model({str(stored)!r}, SmallCNN(1, 10, width=8))\n"
        "assert 'BlurConv2d' in {type(part).__name__ for part in model.modules()}\n"
    )
    assert "composer_fn.algorithms" in modules_after(code)


def test_an_algorithm_named_before_any_is_registered_is_refused_saying_what_to_import() -> None:
    code = (
        "from composer_fn.core.algorithm import algorithm_from_config\n"
        "try:\n"
        "    algorithm_from_config({'algorithm': 'mixup'})\n"
        "except ValueError as error:\n"
        "    assert 'import composer_fn.algorithms' in str(error), error\n"
        "else:\n"
        "    raise AssertionError('an unregistered name was accepted')\n"
    )
    assert "composer_fn.algorithms" not in modules_after(code)
