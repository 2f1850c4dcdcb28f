"""Pareto sweeps: recipes × training lengths × seeds, each run of ``composer-fn train`` kept in its own folder, then
a held-out metric (accuracy, or a language model's perplexity) against wall time, one line per recipe, against the
baseline's frontier.

A sweep file (TOML) names what to run; paths in it are relative to the file::

    recipes = ["../recipes/digits-baseline.toml", "../recipes/digits-mild.toml"]  # the first is the baseline
    max_durations = ["4ep", "8ep"]         # or: scale_schedule_ratios = [0.5, 1.0] (each recipe's own length)
    seeds = [0, 1, 2]
    folder = "../runs/pareto/digits"      # default: a folder named after the sweep file, beside it
    baseline = "digits-baseline"           # optional: the recipe (file stem) the others are measured against
    metric = "accuracy"                    # optional: or "perplexity" (exp of the held-out loss; lower is better)
    [flags]                                # optional: flags for every run, spelled as in recipes
    threads = 1

Run ``<folder>/<recipe>/<length>/seed<k>/`` holds ``run.json`` (what it trains: its recipe's fields with their base
chain merged, its length, its seed and the sweep's flags), its JSON-lines ``log.jsonl``, its checkpoints and, once it
has finished, ``result.json``. A sweep whose run would train something other than its folder's ``run.json`` says
(an edited recipe, other flags) is refused before any run starts, naming the run and the fields that differ, rather
than reading or resuming a run of other settings (a folder without ``run.json`` is taken as it is). A run with a
result is not run again; one without (interrupted) is started with ``--autoresume`` and continues from its newest
checkpoint, appending to its log (one that left no checkpoint starts over, its log replaced). A run's wall time is
the sum of its attempts' training wall times (each attempt's ``fit`` record; an attempt that was cut short counts up
to its last record), so an interrupted run counts the work it redid since its last checkpoint.

The summary gives, per recipe and length, the mean and standard deviation (over seeds, ``ddof=1``) of the held-out
metric and the mean wall time; the baseline's target is its mean at its longest length, and each recipe's speed-up
is the baseline's mean wall time there over the recipe's shortest mean wall time at which its mean is at least as
good as the target (at or above an accuracy, at or below a perplexity). Each point also gets the baseline's time to
its value, read off the baseline's frontier by linear interpolation (``baseline_time_to``), and that time over the
point's: a speed-up at equal quality, defined where the baseline's lengths span the value. Runs sharing the machine slow each other: time comparisons want
``jobs × threads`` at most the cores.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_fn.app._toml import read_toml
from composer_fn.core import validate

__all__ = [
    "Sweep", "RunSpec", "Result", "Point", "Metric", "METRICS", "load_sweep", "run_sweep", "summarise", "draw",
    "write_pareto",
]  # fmt: skip

WIDTH, HEIGHT, DPI = 10, 6, 100


@dataclass(frozen=True)
class Metric:
    """What a sweep compares: its name, whether higher is better, and how a value is written and drawn."""

    name: str
    higher_is_better: bool
    percent: bool

    def of(self, result: Result) -> float:
        """Returns the result's value of this metric."""
        return result.accuracy if self.name == "accuracy" else result.perplexity

    def at_least_as_good(self, value: float, than: float) -> bool:
        """Returns whether ``value`` is as good as ``than`` or better."""
        return value >= than if self.higher_is_better else value <= than

    def signed(self, value: float) -> float:
        """Returns ``value`` with the sign that makes larger better."""
        return value if self.higher_is_better else -value

    def format(self, value: float) -> str:
        """Returns ``value`` as the table writes it."""
        return f"{value:.2%}" if self.percent else f"{value:.2f}"


METRICS = {
    "accuracy": Metric("accuracy", higher_is_better=True, percent=True),
    "perplexity": Metric("perplexity", higher_is_better=False, percent=False),
}
"""The metrics a sweep may compare, by name: held-out accuracy, and held-out perplexity (``exp`` of the loss)."""


class SweepError(ValueError):
    """A sweep file that cannot be read: the message names the file, the field and what is accepted."""


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its recipe, its length (a ``max_duration`` or a scale-schedule ratio) and its seed."""

    recipe: Path
    length: str
    seed: int
    folder: Path
    by_ratio: bool

    @property
    def name(self) -> str:
        """Returns the recipe's name: its file stem."""
        return self.recipe.stem


@dataclass(frozen=True)
class Sweep:
    """A sweep file, read: its runs, the baseline's name, the flags every run gets and where results go."""

    path: Path
    recipes: tuple[Path, ...]
    lengths: tuple[str, ...]
    by_ratio: bool
    seeds: tuple[int, ...]
    folder: Path
    baseline: str
    flags: dict[str, Any] = field(default_factory=dict)
    metric: Metric = METRICS["accuracy"]

    def runs(self) -> list[RunSpec]:
        """Returns every run in the order they run: seed by seed, then length, then recipe, so that a machine whose
        speed drifts over a sweep (a shared host) drifts over every recipe alike rather than over one recipe's
        runs."""
        return [
            RunSpec(recipe, length, seed, self.folder / recipe.stem / _label(length, self.by_ratio) / f"seed{seed}", self.by_ratio)
            for seed in self.seeds
            for length in self.lengths
            for recipe in self.recipes
        ]


@dataclass(frozen=True)
class Result:
    """What a finished run logged: its final held-out accuracy and loss, its wall time and its step count."""

    recipe: str
    length: str
    seed: int
    accuracy: float
    loss: float
    wall_time: float
    steps: int
    attempts: int

    @property
    def perplexity(self) -> float:
        """Returns the held-out perplexity: ``exp`` of the held-out loss (nats per token)."""
        return math.exp(min(self.loss, 700.0))


@dataclass(frozen=True)
class Point:
    """One recipe at one length, over its seeds: the sweep's metric's mean, standard deviation, least and greatest
    value, and the mean wall time."""

    recipe: str
    length: str
    seeds: int
    value: float
    value_std: float
    wall_time: float
    value_min: float
    value_max: float


def _label(length: str, by_ratio: bool) -> str:
    return f"ssr{length}" if by_ratio else length


def load_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Returns the sweep in the TOML file at ``path``; raises ``SweepError`` naming the field that is wrong."""
    source = Path(path)
    if not source.is_file():
        what = "is a folder" if source.is_dir() else "does not exist"
        raise SweepError(f"sweep file {str(source)!r}: {what}; expected a TOML file (see composer_fn.app.pareto)")
    table = read_toml(source, f"sweep file {str(source)!r}", SweepError, "the sweep in composer_fn.app.pareto's docs")
    known = {"recipes", "max_durations", "scale_schedule_ratios", "seeds", "folder", "baseline", "flags", "metric"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise SweepError(f"{source}: unknown field {unknown[0]!r}; accepted: {', '.join(sorted(known))}")
    here = source.parent
    recipes = table.get("recipes")
    if not isinstance(recipes, list) or not recipes or not all(isinstance(r, str) for r in recipes):
        raise SweepError(f"{source}: recipes={recipes!r}: expected a non-empty list of recipe file paths")
    paths = tuple((here / r).resolve() for r in recipes)
    for given, resolved in zip(recipes, paths, strict=True):
        if not resolved.is_file():
            raise SweepError(f"{source}: recipes: {given!r} is not a file ({resolved}); paths are relative to the sweep file")
    stems = [p.stem for p in paths]
    if len(set(stems)) != len(stems):
        raise SweepError(f"{source}: recipes: two files share a name ({stems}); expected one name per recipe")
    if ("max_durations" in table) == ("scale_schedule_ratios" in table):
        raise SweepError(f"{source}: expected exactly one of max_durations (e.g. ['4ep', '8ep']) and scale_schedule_ratios")
    by_ratio = "scale_schedule_ratios" in table
    lengths = table["scale_schedule_ratios" if by_ratio else "max_durations"]
    if by_ratio:
        valid = isinstance(lengths, list) and lengths and all(
            validate.is_real(r) and 0 < r and math.isfinite(r) for r in lengths
        )
        if not valid:
            raise SweepError(f"{source}: scale_schedule_ratios={lengths!r}: expected a non-empty list of numbers > 0")
        texts = tuple(repr(float(r)) for r in lengths)
        if len(set(texts)) != len(texts):
            raise SweepError(f"{source}: scale_schedule_ratios={lengths!r}: a ratio is given twice; expected each once")
    else:
        from composer_fn.core.time import TimeUnit

        if not isinstance(lengths, list) or not lengths:
            raise SweepError(f"{source}: max_durations={lengths!r}: expected a non-empty list such as ['4ep', '8ep']")
        try:
            for text in lengths:
                validate.time("max_durations", text, (TimeUnit.EPOCH, TimeUnit.BATCH), "4ep")
        except ValueError as error:
            raise SweepError(f"{source}: {error}") from None
        texts = tuple(lengths)
        steps = [validate.time("max_durations", text, (TimeUnit.EPOCH, TimeUnit.BATCH), "4ep") for text in lengths]
        if len(set(steps)) != len(steps):
            raise SweepError(f"{source}: max_durations={lengths!r}: a length is given twice; expected each once")
    seeds = table.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(validate.is_integer(s) and s >= 0 for s in seeds):
        raise SweepError(f"{source}: seeds={seeds!r}: expected a non-empty list of whole numbers >= 0")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"{source}: seeds={seeds!r}: a seed is given twice; expected each once")
    baseline = table.get("baseline", stems[0])
    if baseline not in stems:
        raise SweepError(f"{source}: baseline={baseline!r}: expected one of the recipes' names {stems}")
    flags = table.get("flags", {})
    if not isinstance(flags, dict):
        raise SweepError(f"{source}: flags={flags!r}: expected a table of flags, e.g. [flags] threads = 1")
    reserved = {"config", "max_duration", "scale_schedule_ratio", "seed", "save_folder", "autoresume", "log_file", "overwrite_log"}
    taken = sorted(reserved & set(flags))
    if taken:
        raise SweepError(f"{source}: flags.{taken[0]} is set by the sweep for each run; remove it")
    metric = table.get("metric", "accuracy")
    if metric not in METRICS:
        raise SweepError(f"{source}: metric={metric!r}: expected one of {', '.join(METRICS)}")
    folder = here / table["folder"] if "folder" in table else here / "runs" / source.stem
    if folder.exists() and not folder.is_dir():
        raise SweepError(f"{source}: folder={str(table.get('folder', folder))!r} is a file ({folder.resolve()}); expected a folder")
    _check_recipes(source, paths, flags)
    return Sweep(source, paths, texts, by_ratio, tuple(seeds), folder.resolve(), baseline, dict(flags), METRICS[metric])


def _check_recipes(source: Path, recipes: tuple[Path, ...], flags: dict[str, Any]) -> None:
    """Reads each recipe (its fields, algorithms, optimizer, schedule) and the sweep's flags as ``train`` would, so
    that a bad one is found before any run, not after the runs before it."""
    from composer_fn.app.cli import _converters, _parser
    from composer_fn.app.recipes import RecipeError, load_recipe

    converters = _converters(_parser()[1]["train"])
    for name in flags:
        if name not in converters:
            raise SweepError(f"{source}: flags.{name}: not a flag of composer-fn train; accepted: {', '.join(sorted(converters))}")
    for recipe_path in recipes:
        try:
            recipe = load_recipe(recipe_path, converters)
            recipe.build_algorithms()
            recipe.build_optimizer({"name": "sgd", "learning_rate": 0.1}, None if "learning_rate" in recipe.optimizer else 0.1)
            recipe.build_schedule({"name": "constant"})
        except (RecipeError, ValueError, TypeError) as error:
            raise SweepError(f"{source}: recipes: {error}") from None


def _command(run: RunSpec, flags: dict[str, Any]) -> list[str]:
    command = [
        sys.executable, "-m", "composer_fn", "train",
        "--config", str(run.recipe),
        "--scale-schedule-ratio" if run.by_ratio else "--max-duration", run.length,
        "--seed", str(run.seed),
        "--save-folder", str(run.folder / "checkpoints"),
        "--autoresume",
        "--log-file", str(run.folder / "log.jsonl"),
        "--overwrite-log",  # a run that restarts from scratch (no checkpoint yet) replaces its lost attempt's log
        "--no-progress",
    ]  # fmt: skip
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value is not False:
            command += [flag, str(value)]
    return command


def read_result(run: RunSpec) -> Result | None:
    """Returns the finished run's result (from its ``result.json``), or None if it has not finished."""
    path = run.folder / "result.json"
    if not path.is_file():
        return None
    return Result(**json.loads(path.read_text(encoding="utf-8")))


def result_of_log(run: RunSpec) -> Result:
    """Returns the result the run's log records: its last evaluation and the sum of its attempts' wall times."""
    records = [json.loads(line) for line in (run.folder / "log.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    attempts: list[float] = []
    for record in records:
        if record.get("kind") == "hparams":
            attempts.append(0.0)
        elif attempts and record.get("kind") == "fit":
            attempts[-1] = float(record["wall_time"])
        elif attempts and "wall_time" in record:
            attempts[-1] = max(attempts[-1], float(record["wall_time"]))
    evaluations = [r for r in records if r.get("kind") == "eval"]
    if not evaluations:
        raise ValueError(f"run {run.folder} logged no evaluation: expected a held-out evaluation at its end")
    last = evaluations[-1]
    accuracy = next((k for k in last if k.endswith("/accuracy")), None)
    loss = next((k for k in last if k.startswith("eval/") and k.endswith("/loss")), None)
    if accuracy is None or loss is None:
        raise ValueError(f"run {run.folder}'s last evaluation has no accuracy and loss (keys {sorted(last)})")
    return Result(
        run.name,
        run.length,
        run.seed,
        float(last[accuracy]),
        float(last[loss]),
        sum(attempts),
        int(last["step"]),
        len(attempts),
    )


def _write_json(path: Path, value: Any) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as stream:
        json.dump(value, stream, indent=1)
    os.replace(temporary, path)


def run_settings(run: RunSpec, flags: dict[str, Any]) -> dict[str, Any]:
    """Returns what the run trains, as JSON values: its recipe's fields (base chain merged), length, seed, flags."""
    from composer_fn.app.recipes import recipe_fields

    settings = {"recipe": recipe_fields(run.recipe), "length": run.length, "seed": run.seed, "flags": flags}
    return json.loads(json.dumps(settings, sort_keys=True, default=str))


_ABSENT = object()


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {key: leaf for name, item in value.items() for key, leaf in _flat(item, f"{prefix}{name}.").items()}
    return {prefix.removesuffix("."): value}


def check_settings(run: RunSpec, flags: dict[str, Any]) -> None:
    """Raises ``SweepError`` if the run's folder holds a run of other settings than the sweep now gives it."""
    path = run.folder / "run.json"
    if not path.is_file():
        return
    kept, now = _flat(json.loads(path.read_text(encoding="utf-8"))), _flat(run_settings(run, flags))
    changed = sorted(key for key in kept.keys() | now.keys() if kept.get(key, _ABSENT) != now.get(key, _ABSENT))
    if changed:
        raise SweepError(
            f"run {run.folder} was made with other settings than the sweep gives it now ({', '.join(changed)} "
            "differ): remove that folder to run it again, or give the sweep another folder"
        )


def run_one(run: RunSpec, flags: dict[str, Any]) -> Result:
    """Returns the run's result, training it first (or resuming it) unless it has finished."""
    check_settings(run, flags)
    done = read_result(run)
    if done is not None:
        return done
    run.folder.mkdir(parents=True, exist_ok=True)
    if not (run.folder / "run.json").is_file():
        _write_json(run.folder / "run.json", run_settings(run, flags))
    with (run.folder / "output.txt").open("a", encoding="utf-8") as output:
        status = subprocess.call(_command(run, flags), stdout=output, stderr=subprocess.STDOUT)
    if status != 0:
        tail = (run.folder / "output.txt").read_text(encoding="utf-8").strip().splitlines()[-1:]
        raise RuntimeError(f"run {run.folder} failed with status {status}: {tail[0] if tail else 'no output'}")
    result = result_of_log(run)
    _write_json(run.folder / "result.json", result.__dict__)
    return result


def run_sweep(
    sweep: Sweep, *, jobs: int = 1, on_result: Callable[[RunSpec, Result], None] | None = None
) -> list[Result]:
    """Returns every run's result, running the unfinished ones ``jobs`` at a time (finished ones are read)."""
    jobs = validate.integer("jobs", jobs, minimum=1, hint="runs at once")
    runs = sweep.runs()
    for run in runs:  # every run's settings, before any run starts
        check_settings(run, sweep.flags)

    def one(run: RunSpec) -> Result:
        result = run_one(run, sweep.flags)
        if on_result is not None:
            on_result(run, result)
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, runs))


def summarise(sweep: Sweep, results: Sequence[Result]) -> dict[str, list[Point]]:
    """Returns each recipe's points, one per length in the sweep's order, over its seeds."""
    points: dict[str, list[Point]] = {}
    for recipe in sweep.recipes:
        for length in sweep.lengths:
            group = [r for r in results if r.recipe == recipe.stem and r.length == length]
            if not group:
                continue
            values = [sweep.metric.of(r) for r in group]
            points.setdefault(recipe.stem, []).append(
                Point(
                    recipe.stem,
                    length,
                    len(group),
                    statistics.fmean(values),
                    statistics.stdev(values) if len(group) > 1 else 0.0,
                    statistics.fmean(r.wall_time for r in group),
                    min(values),
                    max(values),
                )
            )
    return points


def target(sweep: Sweep, points: dict[str, list[Point]]) -> Point:
    """Returns the baseline's point at its longest length: the value the others must reach, and its time."""
    return points[sweep.baseline][-1]


def speedups(sweep: Sweep, points: dict[str, list[Point]]) -> dict[str, float | None]:
    """Returns, per recipe, the baseline's wall time at the target over the recipe's shortest mean wall time at
    which its mean reaches the target (None if it never does)."""
    goal = target(sweep, points)
    found: dict[str, float | None] = {}
    for recipe, line in points.items():
        reaching = [p.wall_time for p in line if sweep.metric.at_least_as_good(p.value, goal.value)]
        found[recipe] = goal.wall_time / min(reaching) if reaching else None
    return found


def baseline_time_to(sweep: Sweep, points: dict[str, list[Point]], value: float) -> float | None:
    """Returns the wall time the baseline needs for ``value`` of the sweep's metric, read off its frontier (its
    points by wall time, each value the best so far) by linear interpolation between neighbouring points; None
    outside the frontier's range (worse than its shortest point or better than its best, the baseline was not
    measured there)."""
    metric = getattr(sweep, "metric", METRICS["accuracy"])
    goal = metric.signed(value)
    frontier: list[tuple[float, float]] = []
    for p in sorted(points[sweep.baseline], key=lambda p: p.wall_time):
        if not frontier or metric.signed(p.value) > frontier[-1][1]:
            frontier.append((p.wall_time, metric.signed(p.value)))
    if not frontier or not frontier[0][1] <= goal <= frontier[-1][1]:
        return None
    for (t0, a0), (t1, a1) in zip(frontier, frontier[1:], strict=False):
        if a0 <= goal <= a1:
            return t0 + (t1 - t0) * (goal - a0) / (a1 - a0)
    return frontier[0][0]


def table(sweep: Sweep, points: dict[str, list[Point]]) -> str:
    """Returns the summary as a Markdown table, with each recipe's speed-up to the baseline's value."""
    goal = target(sweep, points)
    ratios = speedups(sweep, points)
    metric, write = sweep.metric, sweep.metric.format
    lines = [
        f"| recipe | length | seeds | held-out {metric.name} (mean ± std) | min – max | wall time (s, mean) "
        f"| baseline's time to this {metric.name} |",
        "|---|---|---|---|---|---|---|",
    ]
    for recipe, line in points.items():
        for p in line:
            matched = baseline_time_to(sweep, points, p.value)
            speed = f"{matched:.3g} s ({matched / p.wall_time:.2f}×)" if matched is not None else "outside its range"
            lines.append(
                f"| {recipe} | {_label(p.length, sweep.by_ratio)} | {p.seeds} | {write(p.value)} ± {write(p.value_std)} "
                f"| {write(p.value_min)} – {write(p.value_max)} | {p.wall_time:.3g} | {speed} |"
            )
    lines.append("")
    lines.append(
        f"Target: {sweep.baseline}'s {metric.name} {write(goal.value)} at {_label(goal.length, sweep.by_ratio)}, "
        f"{goal.wall_time:.3g} s."
    )
    for recipe, ratio in ratios.items():
        reached = f"reaches it in {1 / ratio:.2f}× the baseline's time (speed-up {ratio:.2f}×)" if ratio else "does not reach it"
        lines.append(f"- {recipe}: {reached}")
    return "\n".join(lines)


def draw(sweep: Sweep, points: dict[str, list[Point]]) -> Any:
    """Returns the figure: the held-out metric against wall time, a line per recipe (its lengths, error bars over
    seeds), the baseline's frontier in black, and its target as a dashed line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH, HEIGHT), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    colours = iter(f"C{i % 10}" for i in range(100))
    metric = sweep.metric
    scale = 100.0 if metric.percent else 1.0
    for recipe, line in points.items():
        ordered = sorted(line, key=lambda p: p.wall_time)
        baseline = recipe == sweep.baseline
        colour = "black" if baseline else next(colours)
        xs, ys = [p.wall_time for p in ordered], [scale * p.value for p in ordered]
        ax.errorbar(
            xs, ys, yerr=[scale * p.value_std for p in ordered], color=colour, marker="o", capsize=3,
            linewidth=2.5 if baseline else 1.5, label=f"{recipe} (baseline)" if baseline else recipe,
        )  # fmt: skip
    goal = target(sweep, points)
    ax.axhline(scale * goal.value, color="black", linestyle="--", linewidth=0.8, label="baseline's target")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel(f"held-out {metric.name}" + (" (%)" if metric.percent else ""))
    ax.set_title(f"{sweep.path.stem}: {metric.name} against wall time")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right" if metric.higher_is_better else "upper right")
    return figure


def write_pareto(sweep: Sweep, results: Sequence[Result]) -> tuple[Path, Path]:
    """Writes ``pareto.md`` (the table) and ``pareto.png`` (the figure) in the sweep's folder; returns their paths."""
    points = summarise(sweep, results)
    sweep.folder.mkdir(parents=True, exist_ok=True)
    markdown, picture = sweep.folder / "pareto.md", sweep.folder / "pareto.png"
    markdown.write_text(table(sweep, points) + "\n", encoding="utf-8")
    draw(sweep, points).savefig(picture, dpi=DPI)
    _write_json(sweep.folder / "points.json", {recipe: [p.__dict__ for p in line] for recipe, line in points.items()})
    return markdown, picture
