"""Recipe files: every shipped recipe trains a few batches, flags override its fields, and a bad field is refused
in one line naming the file, the field and what is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from composer_fn.algorithms import LabelSmoothing, MixUp
from composer_fn.app.cli import _converters, _parser, main
from composer_fn.app.recipes import recipe_fields

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.toml"))
# Each python-docs method alone (benchmarks/python-docs/methods.toml's runs): recipes on the baseline's data too.
TEXT_METHODS = sorted((ROOT / "benchmarks" / "python-docs" / "methods").glob("*.toml"))
BENCHMARK_FILES = sorted((ROOT / "benchmarks").rglob("*.toml"))


def test_each_embedded_task_has_a_baseline_and_a_mild_recipe() -> None:
    names = {path.stem for path in RECIPES}
    for task in ("digits", "digits-mlp", "synthetic"):
        assert {f"{task}-baseline", f"{task}-mild"} <= names


def test_each_dataset_on_disk_has_a_baseline_and_a_mild_recipe() -> None:
    names = {path.stem for path in RECIPES}
    assert {"fashion-mnist-baseline", "fashion-mnist-mild"} <= names
    assert {"python-docs-baseline", "python-docs-mild", "python-docs-hot"} <= names


def _small_fashion_mnist(root: Path) -> Path:
    # 256 training and 64 held-out 28x28 images in torchvision's layout: the recipe's fields, not the real data
    # (tests/data/test_fashion_mnist.py reads that), are what this checks.
    from composer_fn import random as R
    from composer_fn.data import write_idx

    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for part, count in (("train", 256), ("t10k", 64)):
        write_idx(raw / f"{part}-images-idx3-ubyte.gz", R.randint(R.key(count), 0, 256, (count, 28, 28)).to(torch.uint8))
        write_idx(raw / f"{part}-labels-idx1-ubyte.gz", (torch.arange(count) % 10).to(torch.uint8))
    return root


def _python_docs_slice(root: Path) -> Path:
    # A few files of the Python documentation's sources (Debian's python3-doc), or, where it is not installed, of
    # the standard library's: a few hundred rows, on which the recipe's fields, not its figures, are checked.
    import shutil

    from composer_fn.data.corpus import python_docs_folder

    folder = root / "python-docs"
    try:
        sources = python_docs_folder()
    except FileNotFoundError:
        from tests.data.test_corpus import write_documents

        write_documents(folder)
        return folder
    by_size = sorted(sources.glob("library/*.rst.txt"), key=lambda path: (path.stat().st_size, path.name))
    for path in [path for path in by_size if path.stat().st_size >= 4000][:24]:  # about 300 rows of 128 tokens
        (folder / path.relative_to(sources)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / path.relative_to(sources))
    return folder


# A recipe sized for its whole run is run here for 5 batches, which EMA's half-life of 35 batches is told unfit for.
@pytest.mark.filterwarnings("ignore::composer_fn.core.algorithm.UnfitForTheRun")
@pytest.mark.parametrize("recipe", RECIPES + TEXT_METHODS, ids=lambda path: str(path.relative_to(ROOT).with_suffix("")))
def test_every_recipe_trains_a_few_batches(recipe: Path, capsys, tmp_path: Path, monkeypatch) -> None:
    data = recipe_fields(recipe).get("data")
    on_disk = ["--data-dir", str(_small_fashion_mnist(tmp_path))] if data == "fashion-mnist" else []
    text = data == "python-docs"
    if text:
        monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
        on_disk = ["--data", f"hf:{_python_docs_slice(tmp_path)}"]
    config = recipe
    if recipe_fields(recipe).get("compile"):
        # Eager here: inductor's first compilation of a model takes 30-50 s on one core, which the suite cannot
        # spend per recipe; the compiled step is checked against torch in tests/trainer/test_differential.py.
        config = _write(tmp_path, f"base = {str(recipe)!r}\n[execution]\ncompile = false\n")
    assert main(["train", "--config", str(config), "--max-duration", "5ba", "--no-progress", "--threads", "1", *on_disk]) == 0
    out = capsys.readouterr().out
    steps = int(5 * float(recipe_fields(recipe).get("scale_schedule_ratio", 1.0)))  # a recipe's ratio scales the flag's
    assert f"{steps} steps" in out and ("perplexity" if text else "held-out accuracy") in out


@pytest.mark.parametrize("path", BENCHMARK_FILES, ids=lambda path: str(path.relative_to(ROOT / "benchmarks")))
def test_every_benchmark_sweep_and_recipe_reads(path: Path) -> None:
    # A sweep file (it names recipes) is read as `composer-fn pareto` reads it, every recipe it names built; any
    # other file is a recipe, built as `composer-fn train --config` builds it.
    import tomllib

    from composer_fn.app.pareto import load_sweep
    from composer_fn.app.recipes import load_recipe

    if "recipes" in tomllib.loads(path.read_text(encoding="utf-8")):
        assert load_sweep(path).runs()
    else:
        recipe = load_recipe(path, _converters(_parser()[1]["train"]))
        recipe.build_algorithms()
        recipe.build_schedule({"name": "constant"})


def _write(folder: Path, text: str) -> Path:
    path = folder / "recipe.toml"
    path.write_text(text)
    return path


def test_flags_override_the_fields_and_the_tables_build_what_they_say(tmp_path: Path, capsys) -> None:
    recipe = _write(
        tmp_path,
        'task = "digits-mlp"\nmax_duration = "12ep"\nbatch_size = 32\n'
        "[algorithms.mixup]\nalpha = 0.3\n[algorithms.label_smoothing]\nsmoothing = 0.05\n"
        '[optimizer]\nname = "adamw"\nlearning_rate = 0.001\n',
    )
    from composer_fn.app.recipes import load_recipe

    loaded = load_recipe(recipe, _converters(_parser()[1]["train"]))
    assert loaded.flags["batch_size"] == 32 and str(loaded.flags["max_duration"]) == "12ep"
    assert loaded.build_algorithms() == (MixUp(alpha=0.3), LabelSmoothing(smoothing=0.05))
    assert loaded.build_optimizer({}, None).learning_rate == 0.001
    assert loaded.build_optimizer({}, 0.5).learning_rate == 0.5
    assert main(["train", "--config", str(recipe), "--max-duration", "2ba", "--no-progress", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 steps" in out and "algorithms mixup, label_smoothing" in out
    assert main(["plan", "--config", str(recipe), "--algorithms", "cutout", "--max-duration", "1ep"]) == 0
    assert "cutout" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("speed = 3\n", "field speed: unknown field; accepted: "),
        ("batch_size = 0\n", "field batch_size: invalid value '0'; accepted: a whole number >= 1"),
        ('max_duration = "0.5dur"\n', "field max_duration: invalid value '0.5dur'; accepted: a whole number >= 1 of epochs"),
        ('precision = "fp8"\n', "field precision: invalid value 'fp8'; accepted: fp32, bf16-mixed, fp16-mixed"),
        ("compile = 1\n", "field compile: 1: expected true or false"),
        ("batch_size = true\n", "field batch_size: True: expected what the flag --batch-size takes"),
        ("[algorithms.mixup]\nalpha = -1.0\n", "field algorithms.mixup: alpha=-1.0"),
        ("[algorithms.mixup]\nbeta = 1.0\n", "field algorithms.mixup: unknown hyperparameter 'beta'; accepted: alpha (default 0.2), "),
        ("[optimizer]\nmomentm = 0.5\n", "field optimizer: unknown argument 'momentm'; accepted: learning_rate, momentum (default 0.0), "),
        ('[schedule]\nt_warmpu = "0.1dur"\n', "field schedule: unknown argument 't_warmpu'; accepted: t_warmup, "),
        ("[algorithms.blurpoool]\n", "field algorithms.blurpoool: unknown algorithm; accepted: alibi"),
        ('[optimizer]\nname = "rmsprop"\n', "field optimizer.name: 'rmsprop' is not an optimizer; accepted: sgd"),
        ("[optimizer]\nlearning_rate = -1.0\n", "field optimizer: learning_rate=-1.0"),
        ('[schedule]\nname = "cosine_warmup"\nt_warmup = "soon"\n', "field schedule: "),
        ('callbacks = ["speed", "fast"]\n', "field callbacks: ['speed', 'fast']: expected a list among speed, lr"),
        ('[loggers]\nneptune = "x"\n', "field loggers.neptune: unknown logger; accepted: tensorboard"),
        ('[loggers]\nwandb = "x"\n', "field loggers.wandb: 'x': expected a table of WandBLogger's arguments"),
        ("task = \n", "not TOML"),
        ('[evaluators.val]\nmetrics = ["auc"]\n', "field evaluators.val.metrics: ['auc']: expected a list among accuracy"),
        ("[evaluators.val]\nsubset_num_batches = 0\n", "field evaluators.val: subset_num_batches=0"),
        ("[evaluators]\nval = 3\n", "field evaluators: expected tables [evaluators.<label>]"),
        ("[execution]\nprecison = 'fp32'\n", "field execution.precison: unknown field; accepted: precision, compile"),
        ('precision = "fp32"\n[execution]\nprecision = "fp32"\n', "field execution.precision: the top-level field 'precision'"),
        ("[reporting]\nprogress_bar = 1\n", "field reporting.progress_bar: 1: expected true or false"),
        ('[execution]\nprecision = "fp8"\n', "field precision: invalid value 'fp8'; accepted: fp32"),
        ("execution = 3\n", "field execution: expected a table [execution]"),
    ],
)
def test_a_bad_field_is_refused_in_one_line_naming_file_field_and_what_is_accepted(
    tmp_path: Path, capsys, text: str, message: str
) -> None:
    recipe = _write(tmp_path, text)
    assert main(["train", "--config", str(recipe), "--max-duration", "1ba", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"composer-fn: {recipe}") and message in err, err


def test_a_missing_recipe_is_named(tmp_path: Path, capsys) -> None:
    assert main(["plan", "--config", str(tmp_path / "nothing.toml")]) == 2
    err = capsys.readouterr().err
    assert "--config=" in err and "nothing.toml" in err and "cannot be read" in err


def test_evaluators_of_a_recipe_are_logged_under_their_labels(tmp_path: Path, capsys) -> None:
    recipe = _write(
        tmp_path,
        '[evaluators.heldout]\nmetrics = ["accuracy", "f1"]\n[evaluators.quick]\nsubset_num_batches = 1\n',
    )
    assert main(["train", "--config", str(recipe), "--max-duration", "2ba", "--no-progress", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "eval/heldout/accuracy" in out and "eval/heldout/f1" in out and "eval/quick/loss" in out


def test_a_recipe_on_a_base_replaces_fields_merges_tables_and_appends_algorithms(tmp_path: Path) -> None:
    from composer_fn.app.recipes import load_recipe

    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "base.toml").write_text(
        'task = "digits-mlp"\nmax_duration = "12ep"\nbatch_size = 32\ncallbacks = ["speed"]\n'
        "[algorithms.mixup]\nalpha = 0.3\n[algorithms.label_smoothing]\nsmoothing = 0.05\n"
        '[optimizer]\nname = "sgd"\nlearning_rate = 0.1\nmomentum = 0.9\n'
    )
    (tmp_path / "middle.toml").write_text('base = "shared/base.toml"\nbatch_size = 64\n[algorithms.mixup]\nalpha = 0.5\n')
    recipe = _write(tmp_path, 'base = "middle.toml"\ncallbacks = ["lr"]\n[algorithms.ema]\nhalf_life = "10ba"\n[optimizer]\nlearning_rate = 0.2\n')
    loaded = load_recipe(recipe, _converters(_parser()[1]["train"]))
    assert loaded.flags["batch_size"] == 64 and str(loaded.flags["max_duration"]) == "12ep"
    assert loaded.algorithms == (("mixup", {"alpha": 0.5}), ("label_smoothing", {"smoothing": 0.05}), ("ema", {"half_life": "10ba"}))
    assert loaded.optimizer == {"name": "sgd", "learning_rate": 0.2, "momentum": 0.9}
    assert loaded.callbacks == ("lr",)


def test_the_record_tables_set_what_the_flags_would_and_a_recipe_over_a_base_replaces_them(tmp_path: Path) -> None:
    from composer_fn.app.recipes import load_recipe

    converters = _converters(_parser()[1]["train"])
    tables = _write(
        tmp_path,
        '[execution]\nprecision = "bf16-mixed"\ncompile = true\nmicrobatch_size = 8\ndist_timeout = 60\n'
        '[checkpointing]\nfolder = "runs/a"\ninterval = "2ba"\n[resume]\nautoresume = true\n'
        '[reporting]\nlog_interval = "5ba"\nprogress_bar = false\n',
    )
    (tmp_path / "flat.toml").write_text(
        'precision = "bf16-mixed"\ncompile = true\nmicrobatch_size = 8\ndist_timeout = 60\nsave_folder = "runs/a"\n'
        'save_interval = "2ba"\nautoresume = true\nlog_interval = "5ba"\nno_progress = true\n'
    )
    assert load_recipe(tables, converters).flags == load_recipe(tmp_path / "flat.toml", converters).flags
    (tmp_path / "over.toml").write_text(f'base = "{tables.name}"\nprecision = "fp32"\n[reporting]\nprogress_bar = true\n')
    over = load_recipe(tmp_path / "over.toml", converters).flags
    assert over["precision"] == "fp32" and over["no_progress"] is False and over["microbatch_size"] == 8


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"recipe.toml": 'base = "recipe.toml"\n'}, "field base: 'recipe.toml' leads back to a recipe already read"),
        ({"recipe.toml": 'base = "a.toml"\n', "a.toml": 'base = "recipe.toml"\n'}, "field base: 'recipe.toml' leads back"),
        ({"recipe.toml": 'base = "nothing.toml"\n'}, "field base: 'nothing.toml' ("),
        ({"recipe.toml": "base = 3\n"}, "field base: 3: expected the path of another recipe file"),
        ({"recipe.toml": 'base = "a.toml"\n', "a.toml": "speed = 3\n"}, "field speed: unknown field"),
    ],
)
def test_a_bad_base_is_refused_in_one_line_naming_it(tmp_path: Path, capsys, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert main(["train", "--config", str(tmp_path / "recipe.toml"), "--max-duration", "1ba", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err
