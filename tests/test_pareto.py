"""Pareto sweeps: recipes x lengths x seeds run by the command line, finished runs skipped, an interrupted one
resumed, and a table and picture whose points are the runs' logged values."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from composer_fn.app import pareto
from composer_fn.app.cli import main

RECIPE = 'task = "digits-mlp"\nbatch_size = 128\n[optimizer]\nname = "sgd"\nlearning_rate = 0.2\n{extra}'


def _sweep(folder: Path) -> Path:
    (folder / "plain.toml").write_text(RECIPE.format(extra=""))
    (folder / "smooth.toml").write_text(RECIPE.format(extra="[algorithms.label_smoothing]\nsmoothing = 0.1\n"))
    sweep = folder / "sweep.toml"
    sweep.write_text(
        'recipes = ["plain.toml", "smooth.toml"]\nmax_durations = ["2ba", "5ba"]\nseeds = [0, 1]\n'
        'folder = "out"\n[flags]\nthreads = 1\n'
    )
    return sweep


def _logged_accuracy(run: pareto.RunSpec) -> float:
    # Read straight from the run's log, apart from the code under test.
    records = [json.loads(line) for line in (run.folder / "log.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "eval"][-1]["eval/eval/accuracy"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("sweep")
    sweep = _sweep(folder)
    assert main(["pareto", "--config", str(sweep), "--jobs", "2"]) == 0
    return sweep, ""


def test_every_run_finishes_in_its_own_folder_and_the_picture_decodes(swept) -> None:
    sweep = pareto.load_sweep(swept[0])
    runs = sweep.runs()
    assert len(runs) == 8
    # Seed by seed, then length, then recipe: each recipe's runs spread over the sweep's time alike.
    assert [(run.seed, run.length, run.name) for run in runs] == sorted(
        ((run.seed, run.length, run.name) for run in runs), key=lambda k: (k[0], int(k[1].removesuffix("ba")), k[2] != "plain")
    )
    for run in runs:
        result = pareto.read_result(run)
        assert result is not None and result.attempts == 1
        assert result.accuracy == _logged_accuracy(run)
        assert result.steps == int(run.length.removesuffix("ba"))
    import warnings

    from torchvision.io import decode_png, read_file

    warnings.simplefilter("ignore", DeprecationWarning)

    picture = decode_png(read_file(str(sweep.folder / "pareto.png")))
    assert picture.shape[1:] == (pareto.HEIGHT * pareto.DPI, pareto.WIDTH * pareto.DPI)
    assert "| plain | 5ba | 2 |" in (sweep.folder / "pareto.md").read_text()


def test_the_plots_points_are_the_runs_logged_values(swept) -> None:
    sweep = pareto.load_sweep(swept[0])
    results = [pareto.read_result(run) for run in sweep.runs()]
    points = pareto.summarise(sweep, results)  # type: ignore[arg-type]
    figure = pareto.draw(sweep, points)
    # Each recipe is one error-bar container: its data line, and its label in the legend.
    lines = {container.get_label(): container.lines[0].get_xydata() for container in figure.axes[0].containers}
    for recipe in ("plain", "smooth"):
        label = f"{recipe} (baseline)" if recipe == "plain" else recipe
        expected = []
        for length in ("2ba", "5ba"):
            runs = [r for r in sweep.runs() if r.name == recipe and r.length == length]
            walls = [pareto.result_of_log(r).wall_time for r in runs]
            expected.append((statistics.fmean(walls), 100 * statistics.fmean(_logged_accuracy(r) for r in runs)))
        drawn = sorted(map(tuple, lines[label].tolist()))
        for (x, y), (wall, accuracy) in zip(drawn, sorted(expected), strict=True):
            assert x == pytest.approx(wall, rel=1e-12) and y == pytest.approx(accuracy, rel=1e-12)


def test_a_second_sweep_skips_finished_runs_and_resumes_an_interrupted_one(swept, capsys) -> None:
    sweep = pareto.load_sweep(swept[0])
    runs = sweep.runs()
    before = {run.folder: (run.folder / "log.jsonl").stat().st_mtime_ns for run in runs}
    interrupted = runs[3]
    (interrupted.folder / "result.json").unlink()
    assert main(["pareto", "--config", str(swept[0])]) == 0
    assert "8 runs in" in (out := capsys.readouterr().out) and "(7 finished before)" in out
    for run in runs:
        unchanged = (run.folder / "log.jsonl").stat().st_mtime_ns == before[run.folder]
        assert unchanged == (run is not interrupted)
    resumed = pareto.read_result(interrupted)
    assert resumed is not None and resumed.attempts == 2 and resumed.accuracy == _logged_accuracy(interrupted)


def test_a_run_of_other_settings_is_refused_not_read_or_resumed(tmp_path: Path, capsys) -> None:
    recipe = tmp_path / "plain.toml"
    recipe.write_text(RECIPE.format(extra=""))
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('recipes = ["plain.toml"]\nmax_durations = ["2ba"]\nseeds = [0]\nfolder = "out"\n')
    assert main(["pareto", "--config", str(sweep)]) == 0
    (run,) = pareto.load_sweep(sweep).runs()
    finished = (run.folder / "result.json").read_bytes()
    assert json.loads((run.folder / "run.json").read_text())["recipe"]["optimizer"]["learning_rate"] == 0.2
    capsys.readouterr()
    recipe.write_text(RECIPE.format(extra="").replace("0.2", "0.05"))
    assert main(["pareto", "--config", str(sweep)]) == 2
    error = capsys.readouterr().err
    assert str(run.folder) in error and "recipe.optimizer.learning_rate differ" in error
    assert (run.folder / "result.json").read_bytes() == finished
    (run.folder / "result.json").unlink()  # interrupted: it is not resumed under the new settings either
    assert main(["pareto", "--config", str(sweep)]) == 2
    assert "recipe.optimizer.learning_rate differ" in capsys.readouterr().err
    sweep.write_text(sweep.read_text() + "[flags]\nthreads = 1\n")
    recipe.write_text(RECIPE.format(extra=""))
    assert main(["pareto", "--config", str(sweep)]) == 2
    assert "flags.threads differ" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('recipes = []\nmax_durations = ["1ep"]', "recipes=[]: expected a non-empty list"),
        ('recipes = ["plain.toml"]', "expected exactly one of max_durations"),
        ('recipes = ["plain.toml"]\nmax_durations = ["1sec"]', "max_durations='1sec'"),
        ('recipes = ["nope.toml"]\nmax_durations = ["1ep"]', "'nope.toml' is not a file"),
        ('recipes = ["plain.toml"]\nmax_durations = ["1ep"]\nseeds = [-1]', "seeds=[-1]"),
        ('recipes = ["plain.toml"]\nmax_durations = ["1ep"]\n[flags]\nseed = 3', "flags.seed is set by the sweep"),
        ('recipes = ["plain.toml"]\nmax_durations = ["1ep"]\nbaselne = "x"', "unknown field 'baselne'"),
    ],
)
def test_a_bad_sweep_file_is_refused_naming_the_field(tmp_path: Path, capsys, text: str, message: str) -> None:
    (tmp_path / "plain.toml").write_text(RECIPE.format(extra=""))
    (tmp_path / "sweep.toml").write_text(text)
    assert main(["pareto", "--config", str(tmp_path / "sweep.toml")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "sweep.toml" in err[0] and message in err[0]


def test_lengths_by_scale_schedule_ratio_are_each_recipes_own_length_scaled(tmp_path: Path) -> None:
    (tmp_path / "plain.toml").write_text('max_duration = "4ba"\n' + RECIPE.format(extra=""))
    (tmp_path / "sweep.toml").write_text('recipes = ["plain.toml"]\nscale_schedule_ratios = [0.5]\nseeds = [3]\n')
    sweep = pareto.load_sweep(tmp_path / "sweep.toml")
    (run,) = sweep.runs()
    result = pareto.run_one(run, {"threads": 1})
    assert result.steps == 2 and run.folder.name == "seed3" and run.folder.parent.name == "ssr0.5"
    assert torch.tensor(result.accuracy).isfinite()


def test_the_baselines_time_to_an_accuracy_is_read_off_its_frontier() -> None:
    from types import SimpleNamespace

    def point(recipe: str, wall: float, accuracy: float) -> pareto.Point:
        return pareto.Point(recipe, "x", 3, accuracy, 0.0, wall, accuracy, accuracy)

    # The 30 s point is worse than the 20 s one: off the frontier, so it is never interpolated through.
    points = {"base": [point("base", 10, 0.80), point("base", 20, 0.85), point("base", 30, 0.84), point("base", 40, 0.90)]}
    sweep = SimpleNamespace(baseline="base")
    time_to = lambda accuracy: pareto.baseline_time_to(sweep, points, accuracy)  # type: ignore[arg-type]  # noqa: E731
    assert time_to(0.80) == 10 and time_to(0.85) == 20 and time_to(0.90) == 40
    assert time_to(0.825) == pytest.approx(15) and time_to(0.875) == pytest.approx(30)
    assert time_to(0.79) is None and time_to(0.91) is None


def test_the_table_gives_each_points_spread_and_speed_up_at_equal_accuracy(swept) -> None:
    sweep = pareto.load_sweep(swept[0])
    results = [pareto.read_result(run) for run in sweep.runs()]
    points = pareto.summarise(sweep, results)  # type: ignore[arg-type]
    text = pareto.table(sweep, points)
    for line in points.values():
        for p in line:
            accuracies = [r.accuracy for r in results if r.recipe == p.recipe and r.length == p.length]  # type: ignore[union-attr]
            assert (p.value_min, p.value_max) == (min(accuracies), max(accuracies))
            assert f"| {p.value_min:.2%} – {p.value_max:.2%} |" in text
    # The baseline's points on its frontier (each more accurate than every shorter one) are their own match.
    best = -1.0
    for p in sorted(points["plain"], key=lambda p: p.wall_time):
        if p.value > best:
            assert f"| {p.wall_time:.3g} | {p.wall_time:.3g} s (1.00×) |" in text
            best = p.value


def test_a_perplexity_sweep_counts_lower_as_better(tmp_path: Path) -> None:
    from types import SimpleNamespace

    def result(recipe: str, length: str, seed: int, loss: float, wall: float) -> pareto.Result:
        return pareto.Result(recipe, length, seed, 0.3, loss, wall, 10, 1)

    # The baseline's perplexity falls with its length; the recipe reaches the baseline's best sooner.
    results = [
        *(result("base", length, seed, loss + 0.01 * seed, wall) for length, loss, wall in (("a", 4.0, 10), ("b", 3.0, 20)) for seed in (0, 1)),
        *(result("fast", length, seed, loss, wall) for length, loss, wall in (("a", 3.5, 6), ("b", 2.9, 12)) for seed in (0, 1)),
    ]
    sweep = SimpleNamespace(
        recipes=(Path("base.toml"), Path("fast.toml")), lengths=("a", "b"), baseline="base", by_ratio=False,
        metric=pareto.METRICS["perplexity"],
    )  # fmt: skip
    points = pareto.summarise(sweep, results)  # type: ignore[arg-type]
    base_b = points["base"][1]
    assert base_b.value == pytest.approx(statistics.fmean([torch.tensor(3.0).exp().item(), torch.tensor(3.01).exp().item()]))
    assert (base_b.value_min, base_b.value_max) == pytest.approx((torch.tensor(3.0).exp().item(), torch.tensor(3.01).exp().item()))
    # The recipe's 2.9 at 12 s beats the target (the baseline's longest point); its 3.5 at 6 s does not.
    assert pareto.speedups(sweep, points) == {"base": 1.0, "fast": pytest.approx(20 / 12)}  # type: ignore[arg-type]
    # The baseline's time to a perplexity between its points is interpolated along its frontier.
    between = (points["base"][0].value + points["base"][1].value) / 2
    assert pareto.baseline_time_to(sweep, points, between) == pytest.approx(15)  # type: ignore[arg-type]
    assert pareto.baseline_time_to(sweep, points, points["base"][1].value * 0.9) is None  # type: ignore[arg-type]
    text = pareto.table(sweep, points)  # type: ignore[arg-type]
    assert "held-out perplexity (mean ± std)" in text and f"{base_b.value:.2f}" in text and "fast: reaches it" in text


def test_a_sweep_names_a_metric_it_compares(tmp_path: Path) -> None:
    (tmp_path / "plain.toml").write_text(RECIPE.format(extra=""))
    (tmp_path / "sweep.toml").write_text('recipes = ["plain.toml"]\nmax_durations = ["2ba"]\nmetric = "bleu"\n')
    with pytest.raises(pareto.SweepError, match="metric='bleu': expected one of accuracy, perplexity"):
        pareto.load_sweep(tmp_path / "sweep.toml")
    (tmp_path / "sweep.toml").write_text('recipes = ["plain.toml"]\nmax_durations = ["2ba"]\nmetric = "perplexity"\n')
    assert pareto.load_sweep(tmp_path / "sweep.toml").metric is pareto.METRICS["perplexity"]


@pytest.mark.parametrize(
    ("fields", "recipe_extra", "message"),
    [
        ('max_durations = ["2ba"]\nseeds = [0, 1, 0]\n', "", r"seeds=\[0, 1, 0\]: a seed is given twice"),
        ('max_durations = ["2ba", "3ba", "2ba"]\n', "", r"max_durations=.*: a length is given twice"),
        ("scale_schedule_ratios = [0.5, 0.50]\n", "", r"scale_schedule_ratios=\[0.5, 0.5\]: a ratio is given twice"),
        ('max_durations = ["2ba"]\nfolder = "taken"\n', "", r"folder='taken' is a file .*expected a folder"),
        ('max_durations = ["2ba"]\n[flags]\nthreds = 1\n', "", r"flags.threds: not a flag of composer-fn train"),
        # A bad second recipe is found before the first recipe's runs, not after them.
        ('max_durations = ["2ba"]\n', "[algorithms.mixup]\nalfa = 0.2\n", r"recipes: .*second.toml: field algorithms.mixup: "),
        ('max_durations = ["2ba"]\n', "[schedule]\nname = \"cosine\"\nt_maxx = \"1dur\"\n", r"second.toml: field schedule: "),
        ('max_durations = ["2ba"]\n', "momentum = -1\n", r"second.toml: field optimizer: momentum"),
    ],
    ids=["seeds", "durations", "ratios", "folder", "flag", "algorithm", "schedule", "optimizer"],
)
def test_a_sweep_that_would_waste_or_fail_runs_is_refused_before_any_run(
    tmp_path: Path, fields: str, recipe_extra: str, message: str
) -> None:
    (tmp_path / "first.toml").write_text(RECIPE.format(extra=""))
    (tmp_path / "second.toml").write_text(RECIPE.format(extra="") + recipe_extra)
    (tmp_path / "taken").write_text("")
    (tmp_path / "sweep.toml").write_text('recipes = ["first.toml", "second.toml"]\n' + fields)
    with pytest.raises(pareto.SweepError, match=message):
        pareto.load_sweep(tmp_path / "sweep.toml")
