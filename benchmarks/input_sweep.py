"""Bad and unusual inputs over every surface a user touches, each classified by what the project answers.

Each case is an input a user could give (a flag, a recipe field, a file, an argument of the Python API) and what a
right answer is: ``refuse`` (an error whose message names the argument or file and the value: ``needles``),
``warn`` (it runs, and a warning names the setting), or ``accept`` (a good input, taken). What happened is
classified as:

- right: the answer expected, with every needle in one line (one line on stderr for the command line);
- unclear: refused or warned, but the message misses a needle, spans several lines or is a traceback;
- silent: a bad input taken without a word (or a warning expected and none given);
- refused: a good input refused.

    python benchmarks/input_sweep.py            # the table, then each case that is not right
    python benchmarks/input_sweep.py --all      # every case with its answer
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY_LM = ("--model-kwargs", "n_layer=1,n_embd=32,n_head=2", "--tokenizer", "bpe:300", "--sequence-length", "32")


@dataclass(frozen=True)
class Case:
    surface: str
    what: str
    expect: str  # refuse, warn or accept
    run: Callable[[], tuple[str, str]]  # returns (outcome: refused|warned|accepted|crashed, text)
    needles: tuple[str, ...] = ()


def cli(*argv: str) -> Callable[[], tuple[str, str]]:
    def run() -> tuple[str, str]:
        from composer_fn.app.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                code = main(list(argv))
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 2
            except Exception as error:  # noqa: BLE001 -- a traceback is what the sweep reports
                return "crashed", f"{type(error).__name__}: {error}"
        text = err.getvalue().strip()
        said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        if code != 0:
            return "refused", text
        if said or "warning" in text.lower():
            return "warned", "\n".join(said) or text
        return "accepted", out.getvalue().strip().splitlines()[-1] if out.getvalue().strip() else ""

    return run


def python(call: Callable[[], Any]) -> Callable[[], tuple[str, str]]:
    def run() -> tuple[str, str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                call()
            except (ValueError, TypeError, KeyError, FloatingPointError, OSError) as error:
                return "refused", f"{type(error).__name__}: {error}"
            except Exception as error:  # noqa: BLE001
                return "crashed", f"{type(error).__name__}: {error}"
        said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        return ("warned", "\n".join(said)) if said else ("accepted", "")

    return run


def classify(case: Case, outcome: str, text: str) -> str:
    if case.expect == "accept":
        return "right" if outcome in ("accepted", "warned") else "refused"
    if case.expect == "warn" and outcome == "accepted":
        return "silent"
    if case.expect == "refuse" and outcome in ("accepted", "warned"):
        return "silent"
    wanted = "refused" if case.expect == "refuse" else "warned"
    if outcome != wanted:
        return "unclear"
    lines = [line for line in text.splitlines() if line.strip()]
    if "Traceback" in text or not any(all(needle in line for needle in case.needles) for line in lines):
        return "unclear"
    if case.surface == "command line" and case.expect == "refuse" and len(lines) != 1:
        return "unclear"
    return "right"


def fixtures(folder: Path) -> dict[str, Path]:
    """A digits checkpoint, a log, an image folder (and bad variants), a recipe and a sweep."""
    import numpy as np
    import torch
    from PIL import Image
    from torchvision.io import write_png

    from composer_fn import random as R
    from composer_fn.app.cli import main

    places: dict[str, Path] = {}
    run = folder / "run"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(["train", "--max-duration", "2ba", "--no-progress", "--save-folder", str(run), "--log-file", str(run / "log.jsonl")])
    places["checkpoint"], places["log"] = run / "latest.pt", run / "log.jsonl"
    images = R.randint(R.key(0), 0, 256, (30, 3, 12, 12)).to(torch.uint8)
    photos = folder / "photos"
    for index, image in enumerate(images):
        (photos / ("cat", "dog", "owl")[index % 3]).mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_png(image, str(photos / ("cat", "dog", "owl")[index % 3] / f"{index:02d}.png"))
    places["photos"] = photos
    one = folder / "one-class"
    shutil.copytree(photos / "cat", one / "cat")
    places["one-class"] = one
    corrupt = folder / "corrupt"
    shutil.copytree(photos, corrupt)
    (corrupt / "cat" / "00.png").write_text("not a picture")
    places["corrupt"] = corrupt
    deep = folder / "deep"
    shutil.copytree(photos, deep)
    for file in (deep / "cat").iterdir():
        Image.fromarray(np.arange(144, dtype=np.uint16).reshape(12, 12) * 400).save(file)
    places["deep"] = deep
    (folder / "empty-mnist").mkdir()
    places["empty"] = folder / "empty-mnist"
    recipe = folder / "table.toml"
    recipe.write_text('model_kwargs = {width = 8}\nmax_duration = "2ba"\n')
    places["table-recipe"] = recipe
    (folder / "unknown.toml").write_text('max_duraton = "2ba"\n')
    places["unknown-recipe"] = folder / "unknown.toml"
    base = 'task = "digits-mlp"\n[optimizer]\nname = "sgd"\nlearning_rate = 0.1\n'
    (folder / "a.toml").write_text(base)
    (folder / "b.toml").write_text(base + "[algorithms.mixup]\nalfa = 0.2\n")
    (folder / "taken").write_text("")
    for name, text in {
        "seeds": 'recipes = ["a.toml"]\nmax_durations = ["2ba"]\nseeds = [0, 0]\n',
        "folder": 'recipes = ["a.toml"]\nmax_durations = ["2ba"]\nfolder = "taken"\n',
        "second": 'recipes = ["a.toml", "b.toml"]\nmax_durations = ["2ba"]\n',
        "metric": 'recipes = ["a.toml"]\nmax_durations = ["2ba"]\nmetric = "bleu"\n',
    }.items():
        (folder / f"sweep-{name}.toml").write_text(text)
        places[f"sweep-{name}"] = folder / f"sweep-{name}.toml"
    cut = folder / "cut-past-header"
    shutil.copytree(photos, cut)
    whole = (cut / "dog" / "01.png").read_bytes()
    (cut / "dog" / "01.png").write_bytes(whole[: len(whole) // 2])
    places["cut"] = cut
    corpus = folder / "corpus"
    corpus.mkdir()
    stdlib = Path(shutil.__file__).parent
    for name in ("textwrap", "shlex", "fnmatch", "colorsys", "glob", "bisect", "copy", "keyword", "queue", "string"):
        (corpus / f"{name}.txt").write_text((stdlib / f"{name}.py").read_text(encoding="utf-8"), encoding="utf-8")
    places["corpus"] = corpus
    lm = folder / "lm"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(["train", "--data", f"hf:{corpus}", *TINY_LM, "--batch-size", "8", "--max-duration", "2ba", "--no-progress", "--save-folder", str(lm)])
    places["lm"] = lm / "latest.pt"
    (folder / "zero4.json").write_text('{"zero_optimization": {"stage": 4}}')
    places["zero4"] = folder / "zero4.json"
    (folder / "bad.toml").write_text("max_duration = \"2ba\n")
    places["bad-toml"] = folder / "bad.toml"
    (folder / "sweep-missing.toml").write_text('recipes = ["nope.toml"]\nmax_durations = ["2ba"]\n')
    places["sweep-missing"] = folder / "sweep-missing.toml"
    stepless = folder / "stepless.jsonl"
    stepless.write_text('{"kind": "train", "step": 1, "loss": 1.0}\n{"kind": "train", "loss": 0.5}\n')
    places["stepless"] = stepless
    return places


def cases(places: dict[str, Path], folder: Path) -> list[Case]:
    import numpy as np
    import torch

    from composer_fn import Trainer, export_model, optim
    from composer_fn import functional as F
    from composer_fn import random as R
    from composer_fn.algorithms import EMA, MixUp, ThresholdStopper
    from composer_fn.app.cli import load_trained
    from composer_fn.data import TensorLoader, load_dataset, load_image_folder_task
    from composer_fn.data.idx import read_idx, write_idx
    from composer_fn.models import MLP

    ckpt, log = str(places["checkpoint"]), str(places["log"])
    train = ("train", "--max-duration", "1ba", "--no-progress")
    rows = (R.normal(R.key(0), (16, 6)), R.randint(R.key(1), 0, 2, (16,)))

    def trainer(**arguments: Any) -> Trainer:
        settings = {"max_duration": "2ba", "optimizer": optim.sgd(0.1), "progress_bar": False, **arguments}
        loader = settings.pop("loader", TensorLoader(rows, 8, shuffle=False))
        return Trainer(MLP(6, 2), loader, **settings)

    def batches(bad: Any) -> list[Any]:
        return [(rows[0][:8], rows[1][:8]), bad, (rows[0][8:], rows[1][8:])]

    def fitted(**arguments: Any) -> Callable[[], Any]:
        return lambda: trainer(**arguments).fit()

    def twice() -> None:
        run = trainer()
        run.fit()
        run.fit()

    class Branching(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1) * 2 if x.mean() > 0 else x.flatten(1)

    unpacked = folder / "unpacked-idx3-ubyte.gz"
    write_idx(folder / "raw-idx", torch.zeros(3, 4, dtype=torch.uint8))
    unpacked.write_bytes((folder / "raw-idx").read_bytes())
    C, P = "command line", "Python"
    return [
        Case(C, "--batch-size 0", "refuse", cli(*train, "--batch-size", "0"), ("--batch-size", "'0'")),
        Case(C, "--lr -1", "refuse", cli(*train, "--lr", "-1"), ("--lr", "'-1'")),
        Case(C, "--max-duration 0ep", "refuse", cli(*train[:1], "--max-duration", "0ep"), ("--max-duration", "'0ep'")),
        Case(C, "--max-duration 3 (epochs)", "accept", cli("plan", "--max-duration", "3")),
        Case(C, "--max-duration -3", "refuse", cli("train", "--max-duration", "-3"), ("--max-duration", "'-3'")),
        Case(C, "--save-interval -1ba", "refuse", cli(*train, "--save-interval", "-1ba"), ("--save-interval", "'-1ba'")),
        Case(C, "--seed -1", "refuse", cli(*train, "--seed", "-1"), ("--seed", "'-1'")),
        Case(C, "--threads 0", "refuse", cli(*train, "--threads", "0"), ("--threads", "'0'")),
        Case(C, "--task cifar", "refuse", cli(*train, "--task", "cifar"), ("--task", "'cifar'")),
        Case(C, "--precision fp16", "refuse", cli(*train, "--precision", "fp16"), ("--precision", "'fp16'")),
        Case(C, "--algorithms blurpoool", "refuse", cli(*train, "--algorithms", "blurpoool"), ("--algorithms", "'blurpoool'")),
        Case(C, "--algorithms mixup,mixup", "refuse", cli(*train, "--algorithms", "mixup,mixup"), ("--algorithms", "'mixup'")),
        Case(C, "--algorithms 'ema(halflife=1ba)'", "refuse", cli(*train, "--algorithms", "ema(halflife=1ba)"), ("'halflife'", "half_life")),
        Case(C, "--algorithms 'mixup(alpha=-1)'", "refuse", cli(*train, "--algorithms", "mixup(alpha=-1)"), ("alpha",)),
        Case(C, "--algorithms 'ema(half_life=1ba),mixup(alpha=0.4)'", "accept", cli(*train, "--algorithms", "ema(half_life=1ba),mixup(alpha=0.4)")),
        Case(C, "--algorithms ema on a 2-step run (half-life 1000ba)", "warn", cli("train", "--max-duration", "2ba", "--no-progress", "--algorithms", "ema"), ("half_life='1000ba'",)),
        Case(C, "--set batch_size=0", "refuse", cli(*train, "--set", "batch_size=0"), ("batch_size", "'0'")),
        Case(C, "--set max_duraton=2ba", "refuse", cli(*train, "--set", "max_duraton=2ba"), ("max_duraton",)),
        Case(C, "--set algorithms.ema.half_life=1ba", "accept", cli(*train, "--set", "algorithms.ema.half_life=1ba")),
        Case(C, "--set optimizer.momentum=0.9 (sgd)", "accept", cli(*train, "--set", "optimizer.momentum=0.9")),
        Case(C, "--set with no =", "refuse", cli(*train, "--set", "batch_size"), ("--set", "FIELD=VALUE")),
        Case(C, "--data-dir with --task", "refuse", cli(*train, "--data-dir", str(folder)), ("--data-dir",)),
        Case(C, "--image-size with digits", "refuse", cli(*train, "--image-size", "16"), ("--image-size",)),
        Case(C, "--num-workers with digits", "refuse", cli(*train, "--num-workers", "2"), ("--num-workers",)),
        Case(C, "--overwrite-log without --log-file", "refuse", cli(*train, "--overwrite-log"), ("--overwrite-log",)),
        Case(C, "--tokenizer with images", "refuse", cli(*train, "--tokenizer", "bpe"), ("--tokenizer",)),
        Case(C, "--nproc 3 --batch-size 64", "refuse", cli(*train, "--nproc", "3", "--batch-size", "64"), ("--batch-size=64", "--nproc=3")),
        Case(C, "--log-file a checkpoint --overwrite-log", "refuse", cli(*train, "--log-file", ckpt, "--overwrite-log"), (ckpt, "JSON-lines")),
        Case(C, "--load-path missing", "refuse", cli(*train, "--load-path", str(folder / "nope.pt")), ("--load-path", "nope.pt")),
        Case(C, "--model vit_b_16 on 8x8 digits", "refuse", cli(*train, "--model", "vit_b_16"), ("vit_b_16",)),
        Case(C, "--model-kwargs width=8,depth=3", "refuse", cli(*train, "--model-kwargs", "width=8,depth=3"), ("depth",)),
        Case(C, "--config missing.toml", "refuse", cli(*train, "--config", str(folder / "missing.toml")), ("missing.toml",)),
        Case(C, "--config with an unknown field", "refuse", cli(*train, "--config", str(places["unknown-recipe"])), ("max_duraton",)),
        Case(C, "--config with model_kwargs as a table", "accept", cli("train", "--config", str(places["table-recipe"]), "--no-progress")),
        Case(C, "--data hf:missing", "refuse", cli(*train, "--data", f"hf:{folder / 'absent'}"), ("absent",)),
        Case(C, "--data mnist --data-dir empty", "refuse", cli(*train, "--data", "mnist", "--data-dir", str(places["empty"])), ("empty-mnist",)),
        Case(C, "an image folder of one class", "refuse", cli(*train, "--data", "imagefolder", "--data-dir", str(places["one-class"]), "--batch-size", "2"), ("one class",)),
        Case(C, "an image folder with a text file named .png", "refuse", cli(*train, "--data", "imagefolder", "--data-dir", str(places["corrupt"]), "--batch-size", "4"), ("00.png", "not an image")),
        Case(C, "an image folder with 16-bit PNGs", "accept", cli(*train, "--data", "imagefolder", "--data-dir", str(places["deep"]), "--batch-size", "4", "--model", "small_cnn")),
        Case(C, "export --format tflite", "refuse", cli("export", ckpt, "--format", "tflite"), ("--format", "'tflite'")),
        Case(C, "export --output the checkpoint", "refuse", cli("export", ckpt, "--output", ckpt), ("--output", "checkpoint")),
        Case(C, "export to pt2", "accept", cli("export", ckpt, "--format", "pt2", "--output", str(folder / "m.pt2"))),
        Case(C, "export a log as a checkpoint", "refuse", cli("export", log), (log,)),
        Case(C, "export a missing file", "refuse", cli("export", str(folder / "nope.pt")), ("nope.pt",)),
        Case(C, "predict --output the checkpoint", "refuse", cli("predict", ckpt, "--output", ckpt), ("--output", "checkpoint")),
        Case(C, "predict --output inside a file", "refuse", cli("predict", ckpt, "--output", str(places["log"] / "p.csv")), ("--output", "cannot be written")),
        Case(C, "predict --batch-size 0", "refuse", cli("predict", ckpt, "--batch-size", "0"), ("--batch-size", "'0'")),
        Case(C, "predict --sequence-length on an image model", "refuse", cli("predict", ckpt, "--sequence-length", "64"), ("--sequence-length",)),
        Case(C, "predict a digits model on an image folder", "refuse", cli("predict", ckpt, "--data", "imagefolder", "--data-dir", str(places["photos"])), ("classes",)),
        Case(C, "convert --output the checkpoint", "refuse", cli("convert", ckpt, "--output", ckpt), ("--output", "checkpoint")),
        Case(C, "report a missing run", "refuse", cli("report", str(folder / "nope")), ("nope",)),
        Case(C, "report a checkpoint", "refuse", cli("report", ckpt), (ckpt, "JSON-lines")),
        Case(C, "report --output the log", "refuse", cli("report", log, "--output", log), ("--output", "replace its input")),
        Case(C, "report records without a step", "warn", cli("report", str(places["stepless"]), "--output", str(folder / "r.png")), ("no numeric step",)),
        Case(C, "pareto with a seed twice", "refuse", cli("pareto", "--config", str(places["sweep-seeds"])), ("seeds", "twice")),
        Case(C, "pareto whose folder is a file", "refuse", cli("pareto", "--config", str(places["sweep-folder"])), ("folder='taken'",)),
        Case(C, "pareto with a bad second recipe", "refuse", cli("pareto", "--config", str(places["sweep-second"])), ("b.toml", "algorithms.mixup")),
        Case(C, "pareto metric bleu", "refuse", cli("pareto", "--config", str(places["sweep-metric"])), ("metric='bleu'",)),
        Case(C, "pareto --jobs 0", "refuse", cli("pareto", "--config", str(places["sweep-metric"]), "--jobs", "0"), ("--jobs",)),
        Case(C, "algorithms emma", "refuse", cli("algorithms", "emma"), ("'emma'",)),
        Case(C, "algorithms ema", "accept", cli("algorithms", "ema")),
        Case(P, "MixUp(alpha=-1)", "refuse", python(lambda: MixUp(alpha=-1)), ("alpha",)),
        Case(P, "EMA(half_life='10xx')", "refuse", python(lambda: EMA(half_life="10xx")), ("half_life", "10xx")),
        Case(P, "EMA() on a 20-step run", "warn", python(lambda: trainer(algorithms=[EMA()], max_duration="20ba")), ("half_life='1000ba'", "half_life='2ba'")),
        Case(P, "ThresholdStopper() (accuracy 1.0)", "warn", python(lambda: trainer(algorithms=[ThresholdStopper()], eval_dataloader=TensorLoader(rows, 8))), ("threshold=1.0",)),
        Case(P, "a warm-up longer than the run", "warn", python(lambda: trainer(schedule=optim.LinearWithWarmupScheduler(t_warmup="30ba", t_max="100ba"))), ("t_warmup='30ba'",)),
        Case(P, "Trainer(max_duration='0ba')", "refuse", python(lambda: trainer(max_duration="0ba")), ("max_duration",)),
        Case(P, "adamw(betas=np.array([0.9, 0.99]))", "accept", python(lambda: optim.adamw(0.1, betas=np.array([0.9, 0.99])))),
        Case(P, "sgd(learning_rate=nan)", "refuse", python(lambda: optim.sgd(float("nan"))), ("learning_rate",)),
        Case(P, "load_dataset('mnist', image_size=16)", "refuse", python(lambda: load_dataset("mnist", places["empty"], image_size=16)), ("image_size=16",)),
        Case(P, "load_image_folder_task(image_size=np.int64(8))", "accept", python(lambda: load_image_folder_task(places["photos"], image_size=np.int64(8), batch_size=4))),
        Case(P, "read_idx of an unpacked file named .gz", "accept", python(lambda: read_idx(unpacked))),
        Case(P, "TensorLoader(batch_size=0)", "refuse", python(lambda: TensorLoader(rows, 0)), ("batch_size",)),
        Case(P, "a later batch with class 5 of 2", "refuse", python(fitted(loader=batches((rows[0][:8], torch.full((8,), 5))), max_duration="3ba")), ("step 2", "class 5")),
        Case(P, "a later batch of int32 labels", "refuse", python(fitted(loader=batches((rows[0][:8], rows[1][:8].int())), max_duration="3ba")), ("step 2", "int32")),
        Case(P, "a later batch of [B, 1] labels", "refuse", python(fitted(loader=batches((rows[0][:8], rows[1][:8, None])), max_duration="3ba")), ("step 2", "[B, 1]")),
        Case(P, "a later batch of 7 features", "refuse", python(fitted(loader=batches((R.normal(R.key(3), (8, 7)), rows[1][:8])), max_duration="3ba")), ("step 2", "[B, 7]")),
        Case(P, "inputs and labels of different lengths", "refuse", python(fitted(loader=batches((rows[0][:8], rows[1][:6])), max_duration="3ba")), ("step 2", "different numbers of samples")),
        Case(P, "NaN inputs", "refuse", python(fitted(loader=[(torch.full((8, 6), float("nan")), rows[1][:8])] * 2)), ("step 1", "NaN")),
        Case(P, "fit() again after the run's end", "warn", python(twice), ("fit()",)),
        Case(P, "fit(duration='1ep')", "accept", python(lambda: trainer().fit(duration="1ep"))),
        Case(P, "export_model with one sample", "refuse", python(lambda: export_model(MLP(6, 2), rows[0][:1], folder / "x.ts")), ("example",)),
        Case(P, "export_model of a value branch, two batches", "refuse", python(lambda: export_model(Branching(), rows[0][:4].abs() + 1, folder / "b.ts", check_batches=[-rows[0][4:8].abs() - 1])), ("check batch 1",)),
        Case(P, "mixup_batch without key or mixing", "refuse", python(lambda: F.mixup_batch(rows[0][:, None, None, :], rows[1], num_classes=2)), ("key",)),
        Case(P, "cutout_batch(length=2.0)", "refuse", python(lambda: F.cutout_batch(torch.zeros(2, 1, 8, 8), length=2.0, key=R.key(0))), ("length",)),
        Case(P, "load_trained of a command-line checkpoint", "accept", python(lambda: load_trained(ckpt))),
        *more_cases(places, folder, trainer, batches, rows),
        *recipe_and_reader_cases(places, folder, trainer, rows),
    ]


def recipe_and_reader_cases(places: dict[str, Path], folder: Path, trainer: Callable[..., Any], rows: Any) -> list[Case]:
    """Recipe tables, evaluators, loggers and callbacks, the data readers, export and the functional API."""
    import torch

    from composer_fn import Evaluator, export_model
    from composer_fn import functional as F
    from composer_fn import random as R
    from composer_fn.callbacks import NaNMonitor, SpeedMonitor
    from composer_fn.data import (
        TensorLoader,
        load_cifar_task,
        load_dataset,
        load_idx_task,
        read_idx,
        synthetic_images,
    )
    from composer_fn.loggers import JSONLLogger, TensorBoardLogger
    from composer_fn.models import MLP
    from composer_fn.models.zoo import build_model

    train = ("train", "--max-duration", "1ba", "--no-progress")
    idx = folder / "bad-idx"
    idx.write_bytes(b"\x00\x00\x08\x03" + (5).to_bytes(4, "big") + (4).to_bytes(4, "big") + (4).to_bytes(4, "big") + bytes(30))
    held = TensorLoader(rows, 8, shuffle=False)

    def recipe(name: str, text: str) -> str:
        path = folder / f"r-{name}.toml"
        path.write_text(text)
        return str(path)

    C, P = "command line", "Python"
    return [
        Case(C, "recipe [optimizer] name = 'lion'", "refuse", cli(*train, "--config", recipe("lion", '[optimizer]\nname = "lion"\n')), ("optimizer", "lion")),
        Case(C, "recipe [optimizer] momentum = 'high'", "refuse", cli(*train, "--config", recipe("momentum", '[optimizer]\nmomentum = "high"\n')), ("momentum",)),
        Case(C, "recipe [optimizer] learning_rate = 0.05 (no name)", "accept", cli(*train, "--config", recipe("lr", "[optimizer]\nlearning_rate = 0.05\n"))),
        Case(C, "recipe [schedule] name = 'step'", "refuse", cli(*train, "--config", recipe("step", '[schedule]\nname = "step"\n')), ("schedule", "step")),
        Case(C, "recipe [schedule] t_warmup = '0.1dur'", "accept", cli(*train, "--config", recipe("warm", '[schedule]\nt_warmup = "0.1dur"\n'))),
        Case(C, "recipe [algorithms.mixup] alfa = 0.2", "refuse", cli(*train, "--config", recipe("alfa", "[algorithms.mixup]\nalfa = 0.2\n")), ("alfa", "alpha")),
        Case(C, "recipe [algorithms.nope]", "refuse", cli(*train, "--config", recipe("nope", "[algorithms.nope]\n")), ("nope",)),
        Case(C, "recipe [algorithms.ema] half_life = 5 (a bare int)", "refuse", cli(*train, "--config", recipe("ema5", "[algorithms.ema]\nhalf_life = 5\n")), ("half_life",)),
        Case(C, "recipe callbacks = ['speed', 'spede']", "refuse", cli(*train, "--config", recipe("cb", 'callbacks = ["speed", "spede"]\n')), ("spede",)),
        Case(C, "recipe callbacks = 'speed' (not a list)", "refuse", cli(*train, "--config", recipe("cbs", 'callbacks = "speed"\n')), ("callbacks",)),
        Case(C, "recipe [loggers] tensorbord = 'x'", "refuse", cli(*train, "--config", recipe("tb", '[loggers]\ntensorbord = "x"\n')), ("tensorbord",)),
        Case(C, "recipe [loggers] wandb = {projcet = 'x'}", "refuse", cli(*train, "--config", recipe("wb", '[loggers]\nwandb = {projcet = "x", mode = "offline"}\n')), ("projcet",)),
        Case(C, "recipe [evaluators.held] metrics = ['bleu']", "refuse", cli(*train, "--config", recipe("bleu", '[evaluators.held]\nmetrics = ["bleu"]\n')), ("bleu",)),
        Case(C, "recipe [evaluators.held] metrics = ['f1']", "accept", cli(*train, "--config", recipe("f1", '[evaluators.held]\nmetrics = ["f1"]\n'))),
        Case(C, "recipe [execution] precision and a top-level precision", "refuse", cli(*train, "--config", recipe("twice", 'precision = "fp32"\n[execution]\nprecision = "fp32"\n')), ("precision",)),
        Case(C, "recipe [execution] compile = 'yes'", "refuse", cli(*train, "--config", recipe("compile", '[execution]\ncompile = "yes"\n')), ("compile",)),
        Case(C, "recipe base = a missing file", "refuse", cli(*train, "--config", recipe("base", 'base = "absent.toml"\n')), ("absent.toml",)),
        Case(C, "recipe base = itself", "refuse", cli(*train, "--config", recipe("loop", 'base = "r-loop.toml"\n')), ("r-loop.toml",)),
        Case(C, "recipe batch_size = 12.5", "refuse", cli(*train, "--config", recipe("float", "batch_size = 12.5\n")), ("batch_size",)),
        Case(C, "recipe task = 'digits' with data = 'mnist'", "refuse", cli(*train, "--config", recipe("both", 'task = "digits"\ndata = "mnist"\n')), ("--task", "--data")),
        Case(C, "--set algorithms.ema={}", "accept", cli(*train, "--set", "algorithms.ema={}", "--set", "algorithms.ema.half_life=1ba")),
        Case(C, "--set execution.precision=fp8", "refuse", cli(*train, "--set", "execution.precision=fp8"), ("precision", "fp8")),
        Case(C, "--set schedule.t_warmup=2xx", "refuse", cli(*train, "--set", "schedule.t_warmup=2xx"), ("t_warmup", "2xx")),
        Case(C, "--data fashion-mnist --data-dir a folder of other files", "refuse", cli(*train, "--data", "fashion-mnist", "--data-dir", str(places["photos"])), ("photos",)),
        Case(C, "--data mnist --data-dir a bad IDX file", "refuse", cli(*train, "--data", "mnist", "--data-dir", str(places["empty"])), ("empty-mnist",)),
        Case(P, "read_idx of a file whose header promises more than it holds", "refuse", python(lambda: read_idx(idx)), ("bad-idx",)),
        Case(P, "read_idx of a missing file", "refuse", python(lambda: read_idx(folder / "absent-idx")), ("absent-idx",)),
        Case(P, "load_idx_task('mnist2')", "refuse", python(lambda: load_idx_task("mnist2", folder)), ("mnist2",)),
        Case(P, "load_idx_task('mnist', an empty folder)", "refuse", python(lambda: load_idx_task("mnist", places["empty"])), ("empty-mnist",)),
        Case(P, "load_cifar_task('cifar10', label_mode='coarse')", "refuse", python(lambda: load_cifar_task("cifar10", places["empty"], label_mode="coarse")), ("label_mode",)),
        Case(P, "load_dataset('cifar1000')", "refuse", python(lambda: load_dataset("cifar1000", folder)), ("cifar1000",)),
        Case(P, "synthetic_images(num_classes=0)", "refuse", python(lambda: synthetic_images(R.key(0), 8, num_classes=0)), ("num_classes",)),
        Case(P, "build_model('mlp', image_shape=(1, 8))", "refuse", python(lambda: build_model("mlp", (1, 8), 10)), ("image_shape",)),
        Case(P, "build_model('resnet18', options={'num_classes': 3})", "refuse", python(lambda: build_model("resnet18", (3, 32, 32), 10, options={"num_classes": 3})), ("num_classes",)),
        Case(P, "Evaluator(label='held out')", "refuse", python(lambda: Evaluator("held out", held)), ("label", "held out")),
        Case(P, "Evaluator of an iterator (one pass)", "refuse", python(lambda: Evaluator("held", iter(held))), ("dataloader",)),
        Case(P, "Evaluator(subset_num_batches=0)", "refuse", python(lambda: Evaluator("held", held, subset_num_batches=0)), ("subset_num_batches",)),
        Case(P, "Evaluator(eval_interval='3ba') under the trainer's '2ba'", "refuse", python(lambda: trainer(eval_dataloader=Evaluator("held", held, eval_interval="3ba"), eval_interval="2ba", max_duration="4ba")), ("3ba", "2ba")),
        Case(P, "Evaluator with a metric of another task", "refuse", python(lambda: trainer(eval_dataloader=Evaluator("held", held, metrics={"mse": _mse()})).fit()), ("mse",)),
        Case(P, "two Evaluators of one label", "refuse", python(lambda: trainer(eval_dataloader=[Evaluator("a", held), Evaluator("a", held)])), ("'a'",)),
        Case(P, "eval_dataloader of 3-class labels for a 2-class model", "refuse", python(lambda: trainer(eval_dataloader=TensorLoader((rows[0], torch.full((16,), 2)), 8)).fit()), ("class 2",)),
        Case(P, "JSONLLogger of a folder", "refuse", python(lambda: JSONLLogger(folder)), (str(folder),)),
        Case(P, "TensorBoardLogger(flush_secs=0)", "refuse", python(lambda: TensorBoardLogger(folder / "tb", flush_secs=0)), ("flush_secs",)),
        Case(P, "SpeedMonitor(window_size=0)", "refuse", python(lambda: SpeedMonitor(window_size=0)), ("window_size",)),
        Case(P, "NaNMonitor(interval=0)", "refuse", python(lambda: NaNMonitor(interval=0)), ("interval",)),
        Case(P, "Trainer(callbacks=[SpeedMonitor]) (a class)", "refuse", python(lambda: trainer(callbacks=[SpeedMonitor])), ("callbacks",)),
        Case(P, "Trainer(loggers='tensorboard') (a name)", "refuse", python(lambda: trainer(loggers="tensorboard")), ("loggers",)),
        Case(P, "Trainer(save_folder=..., save_interval='0ba')", "refuse", python(lambda: trainer(save_folder=str(folder / "s"), save_interval="0ba")), ("save_interval",)),
        Case(P, "Trainer(save_num_checkpoints_to_keep=-2)", "refuse", python(lambda: trainer(save_folder=str(folder / "s2"), save_num_checkpoints_to_keep=-2)), ("save_num_checkpoints_to_keep",)),
        Case(P, "Trainer(save_folder='s3://bucket' unreachable)", "refuse", python(lambda: trainer(save_folder="s3://composer-fn-sweep-absent/run")), ("s3://composer-fn-sweep-absent",)),
        Case(P, "export_model(format='tflite')", "refuse", python(lambda: export_model(MLP(6, 2), rows[0][:4], folder / "x.tfl", format="tflite")), ("format", "tflite")),
        Case(P, "export_model of an example of the wrong width", "refuse", python(lambda: export_model(MLP(6, 2), torch.zeros(4, 5), folder / "w.ts")), ("example", "(4, 5)")),
        Case(P, "export_model to a folder", "refuse", python(lambda: export_model(MLP(6, 2), rows[0][:4], folder)), (str(folder),)),
        Case(P, "cutout_batch of a 2-d batch", "refuse", python(lambda: F.cutout_batch(torch.zeros(4, 8), length=0.5, key=R.key(0))), ("input",)),
        Case(P, "randaugment_batch(severity=20)", "refuse", python(lambda: F.randaugment_batch(torch.zeros(2, 3, 8, 8), severity=20, key=R.key(0))), ("severity",)),
        Case(P, "resize_batch(scale_factor=0)", "refuse", python(lambda: F.resize_batch(torch.zeros(2, 3, 8, 8), torch.zeros(2), scale_factor=0)), ("scale_factor",)),
        Case(P, "mixup_batch with 3-class probability targets of 2 rows for 4 images", "refuse", python(lambda: F.mixup_batch(torch.zeros(4, 1, 4, 4), torch.full((2, 3), 1 / 3), key=R.key(0))), ("4", "2")),
        Case(P, "smooth_labels of probabilities", "accept", python(lambda: F.smooth_labels(torch.zeros(2, 3), torch.full((2, 3), 1 / 3), smoothing=0.1))),
    ]


def _mse() -> Any:
    import torchmetrics

    return torchmetrics.MeanSquaredError()


def more_cases(places: dict[str, Path], folder: Path, trainer: Callable[..., Any], batches: Callable[[Any], list[Any]], rows: Any) -> list[Case]:
    import torch

    from composer_fn import Trainer, optim
    from composer_fn import functional as F
    from composer_fn import random as R
    from composer_fn.algorithms import CutMix, LabelSmoothing, ProgressiveResizing, SelectiveBackprop
    from composer_fn.data import TensorLoader, load_image_folder_task
    from composer_fn.models import MLP

    class GoesWrong(torch.nn.Module):
        """MLP(6, 2) whose outputs go wrong (as ``wrong`` says) on a batch whose first input is over 100."""

        def __init__(self, wrong: str) -> None:
            super().__init__()
            self.mlp, self.wrong = MLP(6, 2), wrong

        def forward(self, x: Any) -> Any:
            logits = self.mlp(x)
            if float(x[0, 0]) <= 100:
                return logits
            return {"short": logits[:-1], "dict": {"scores": logits}, "none": None, "flat": logits.reshape(-1)}[self.wrong]

    ckpt, lm, photos, log = str(places["checkpoint"]), str(places["lm"]), str(places["photos"]), str(places["log"])
    train = ("train", "--max-duration", "1ba", "--no-progress")
    marked = (rows[0][:8].clone(), rows[1][:8])
    marked[0][0, 0] = 1000.0

    def wrong(kind: str) -> Callable[[], Any]:
        return lambda: Trainer(GoesWrong(kind), batches(marked), max_duration="3ba", optimizer=optim.sgd(0.1), progress_bar=False).fit()

    C, P = "command line", "Python"
    return [
        Case(C, "--batch-size abc", "refuse", cli(*train, "--batch-size", "abc"), ("--batch-size", "'abc'")),
        Case(C, "--lr abc", "refuse", cli(*train, "--lr", "abc"), ("--lr", "'abc'")),
        Case(C, "--lr nan", "refuse", cli(*train, "--lr", "nan"), ("--lr", "'nan'")),
        Case(C, "--max-duration 2xx", "refuse", cli(*train[:1], "--max-duration", "2xx"), ("--max-duration", "'2xx'")),
        Case(C, "--max-duration 0.5ep (epochs are whole, as Composer's)", "refuse", cli("plan", "--max-duration", "0.5ep"), ("--max-duration", "'0.5ep'")),
        Case(C, "--eval-interval 0ba", "refuse", cli(*train, "--eval-interval", "0ba"), ("--eval-interval", "'0ba'")),
        Case(C, "--log-interval 0ba", "refuse", cli(*train, "--log-interval", "0ba"), ("--log-interval", "'0ba'")),
        Case(C, "--save-interval without --save-folder", "refuse", cli(*train, "--save-interval", "1ba"), ("--save-interval", "--save-folder")),
        Case(C, "--scale-schedule-ratio 0", "refuse", cli(*train, "--scale-schedule-ratio", "0"), ("--scale-schedule-ratio", "'0'")),
        Case(C, "--scale-schedule-ratio 0.5", "accept", cli("train", "--max-duration", "4ba", "--no-progress", "--scale-schedule-ratio", "0.5")),
        Case(C, "--microbatch-size 0", "refuse", cli(*train, "--microbatch-size", "0"), ("--microbatch-size", "'0'")),
        Case(C, "--microbatch-size 100 > --batch-size 64", "refuse", cli(*train, "--microbatch-size", "100", "--batch-size", "64"), ("100", "64")),
        Case(C, "--microbatch-size 16", "accept", cli(*train, "--microbatch-size", "16")),
        Case(C, "--image-size 0 (imagefolder)", "refuse", cli(*train, "--data", "imagefolder", "--data-dir", photos, "--image-size", "0"), ("--image-size", "'0'")),
        Case(C, "--sequence-length 0 (text)", "refuse", cli(*train, "--data", f"hf:{places['corpus']}", "--sequence-length", "0"), ("--sequence-length", "'0'")),
        Case(C, "--tokenizer bpe:1 (text)", "refuse", cli(*train, "--data", f"hf:{places['corpus']}", "--tokenizer", "bpe:1"), ("--tokenizer", "bpe:1")),
        Case(C, "--tokenizer a missing file", "refuse", cli(*train, "--data", f"hf:{places['corpus']}", "--tokenizer", str(folder / "tok.json")), ("--tokenizer", "tok.json")),
        Case(C, "--text-column body (no such column)", "refuse", cli(*train, "--data", f"hf:{places['corpus']}", "--text-column", "body", *TINY_LM), ("body", "text")),
        Case(C, "--data imagefolder without --data-dir", "refuse", cli(*train, "--data", "imagefolder"), ("--data-dir",)),
        Case(C, "--data imagefolder --data-dir a file", "refuse", cli(*train, "--data", "imagefolder", "--data-dir", ckpt), ("--data-dir", ckpt)),
        Case(C, "an image folder with a PNG cut past its header, read by a worker", "refuse", cli(*train, "--data", "imagefolder", "--data-dir", str(places["cut"]), "--batch-size", "4", "--num-workers", "1"), ("01.png", "cannot be decoded")),
        Case(C, "--data cifar10 --data-dir empty", "refuse", cli(*train, "--data", "cifar10", "--data-dir", str(places["empty"])), ("empty-mnist",)),
        Case(C, "--model resnet18 --model-kwargs num_classes=3", "refuse", cli(*train, "--model", "resnet18", "--model-kwargs", "num_classes=3"), ("num_classes",)),
        Case(C, "--model unknown_net", "refuse", cli(*train, "--model", "unknown_net"), ("unknown_net",)),
        Case(C, "--model gpt2 on images", "refuse", cli(*train, "--model", "gpt2"), ("gpt2",)),
        Case(C, "--model-kwargs 'width'", "refuse", cli(*train, "--model-kwargs", "width"), ("--model-kwargs", "width")),
        Case(C, "--fsdp without --nproc", "refuse", cli(*train, "--fsdp"), ("--fsdp", "--nproc")),
        Case(C, "--nproc 0", "refuse", cli(*train, "--nproc", "0"), ("--nproc", "'0'")),
        Case(C, "--dist-timeout 0", "refuse", cli(*train, "--dist-timeout", "0"), ("--dist-timeout", "'0'")),
        Case(C, "--deepspeed missing.json", "refuse", cli(*train, "--deepspeed", str(folder / "missing.json")), ("--deepspeed", "missing.json")),
        Case(C, "--deepspeed with stage 4", "refuse", cli(*train, "--deepspeed", str(places["zero4"])), ("stage", "4")),
        Case(C, "--config a malformed TOML", "refuse", cli(*train, "--config", str(places["bad-toml"])), ("bad.toml",)),
        Case(C, "--config a checkpoint", "refuse", cli(*train, "--config", ckpt), (ckpt,)),
        Case(C, "--set schedule.name=cosine_typo", "refuse", cli(*train, "--set", "schedule.name=cosine_typo"), ("cosine_typo",)),
        Case(C, "--set optimizer.name=lion", "refuse", cli(*train, "--set", "optimizer.name=lion"), ("lion",)),
        Case(C, "--set loggers.wandb=1", "refuse", cli(*train, "--set", "loggers.wandb=1"), ("loggers.wandb",)),
        Case(C, "--set callbacks=[\"nope\"]", "refuse", cli(*train, "--set", 'callbacks=["nope"]'), ("nope",)),
        Case(C, "--algorithms 'ema(half_life=1ba' (unclosed)", "refuse", cli(*train, "--algorithms", "ema(half_life=1ba"), ("--algorithms", "ema(half_life=1ba")),
        Case(C, "--algorithms alibi on an image model", "refuse", cli(*train, "--algorithms", "alibi"), ("Alibi", "SmallCNN")),
        Case(C, "--algorithms seq_length_warmup on images", "refuse", cli(*train, "--algorithms", "seq_length_warmup"), ("sequence length warmup", "image batch")),
        Case(C, "--algorithms progressive_resizing on 8x8 digits, MLP", "refuse", cli(*train, "--model", "mlp", "--algorithms", "progressive_resizing"), ("ProgressiveResizing", "MLP fails on 4x4")),
        Case(C, "--load-path a log file", "refuse", cli(*train, "--load-path", str(places["log"])), ("--load-path", "log.jsonl")),
        Case(C, "--load-path an LM checkpoint into digits", "refuse", cli(*train, "--load-path", lm), ("lm/latest.pt", "another model")),
        Case(C, "--autoresume without --save-folder", "refuse", cli(*train, "--autoresume"), ("--autoresume", "--save-folder")),
        Case(C, "export --inputs unit of a language model", "refuse", cli("export", lm, "--inputs", "unit"), ("--inputs unit", "token ids")),
        Case(C, "export a language model to pt2", "accept", cli("export", lm, "--format", "pt2", "--output", str(folder / "lm.pt2"))),
        Case(C, "export --data-dir missing", "refuse", cli("export", ckpt, "--data-dir", str(folder / "absent")), ("--data-dir", "absent")),
        Case(C, "predict --sequence-length 0 of a language model", "refuse", cli("predict", lm, "--sequence-length", "0"), ("--sequence-length", "'0'")),
        Case(C, "predict --sequence-length 64 past the model's positions", "refuse", cli("predict", lm, "--sequence-length", "64"), ("--sequence-length=64", "32 positions")),
        Case(C, "predict a language model on mnist", "refuse", cli("predict", lm, "--data", "mnist"), ("--data mnist",)),
        Case(C, "predict --split validation", "refuse", cli("predict", ckpt, "--split", "validation"), ("--split", "'validation'")),
        Case(C, "predict a digits model on --task digits-mlp (the same images)", "accept", cli("predict", ckpt, "--task", "digits-mlp", "--output", str(folder / "p.csv"))),
        Case(C, "convert --format onnx", "refuse", cli("convert", ckpt, "--output", str(folder / "c.onnx"), "--format", "onnx"), ("--format", "'onnx'")),
        Case(C, "convert to safetensors", "accept", cli("convert", ckpt, "--output", str(folder / "c.safetensors"), "--format", "safetensors")),
        Case(C, "convert without --output", "refuse", cli("convert", ckpt), ("--output",)),
        Case(C, "report --labels of the wrong count", "refuse", cli("report", log, "--compare", log, "--labels", "a,b,c", "--output", str(folder / "r2.png")), ("--labels",)),
        Case(C, "report --output a .txt file", "refuse", cli("report", log, "--output", str(folder / "r.txt")), ("--output", "r.txt")),
        Case(C, "pareto without --config", "refuse", cli("pareto"), ("--config",)),
        Case(C, "pareto with a missing recipe", "refuse", cli("pareto", "--config", str(places["sweep-missing"])), ("nope.toml",)),
        Case(C, "an unknown command", "refuse", cli("trian"), ("'trian'",)),
        Case(C, "profile --steps 0", "refuse", cli("profile", "--steps", "0"), ("--steps", "'0'")),
        Case(P, "a later output with logits for 7 of 8 samples", "refuse", python(wrong("short")), ("step 2", "[7, 2]", "8")),
        Case(P, "a later output that is a dict without logits or loss", "refuse", python(wrong("dict")), ("step 2", "'scores'", "'logits'")),
        Case(P, "a later output that is None", "refuse", python(wrong("none")), ("step 2", "None")),
        Case(P, "a later output of flat logits", "refuse", python(wrong("flat")), ("step 2", "[16]")),
        Case(P, "Trainer(model=None)", "refuse", python(lambda: Trainer(None, TensorLoader(rows, 8), max_duration="1ba")), ("model",)),
        Case(P, "Trainer without max_duration", "refuse", python(lambda: Trainer(MLP(6, 2), TensorLoader(rows, 8)).fit()), ("max_duration",)),
        Case(P, "Trainer(precision='fp8')", "refuse", python(lambda: trainer(precision="fp8")), ("precision", "'fp8'")),
        Case(P, "Trainer(seed=-1)", "refuse", python(lambda: trainer(seed=-1)), ("seed", "-1")),
        Case(P, "Trainer(eval_interval='0ba')", "refuse", python(lambda: trainer(eval_interval="0ba", eval_dataloader=TensorLoader(rows, 8))), ("eval_interval",)),
        Case(P, "Trainer(device_train_microbatch_size=0)", "refuse", python(lambda: trainer(device_train_microbatch_size=0)), ("device_train_microbatch_size",)),
        Case(P, "Trainer(device='tpu')", "refuse", python(lambda: trainer(device="tpu")), ("device", "tpu")),
        Case(P, "Trainer(optimizer=torch.optim.SGD(...))", "refuse", python(lambda: trainer(optimizer=torch.optim.SGD(MLP(6, 2).parameters(), lr=0.1))), ("optimizer",)),
        Case(P, "Trainer(algorithms=MixUp) (a class)", "refuse", python(lambda: trainer(algorithms=[SelectiveBackprop])), ("algorithms",)),
        Case(P, "Trainer(train_dataloader=[]) (no batches)", "refuse", python(lambda: trainer(loader=[]).fit()), ("train_dataloader",)),
        Case(P, "TensorLoader of tensors of different lengths", "refuse", python(lambda: TensorLoader((rows[0], rows[1][:5]), 4)), ("16", "5")),
        Case(P, "load_image_folder_task of a missing folder", "refuse", python(lambda: load_image_folder_task(folder / "absent")), ("absent",)),
        Case(P, "load_image_folder_task(batch_size=0)", "refuse", python(lambda: load_image_folder_task(photos, batch_size=0)), ("batch_size",)),
        Case(P, "CutMix(alpha=0) (Composer's λ = 0)", "accept", python(lambda: CutMix(alpha=0))),
        Case(P, "CutMix(alpha=-1)", "refuse", python(lambda: CutMix(alpha=-1)), ("alpha", "-1")),
        Case(P, "LabelSmoothing(smoothing=1.5)", "refuse", python(lambda: LabelSmoothing(smoothing=1.5)), ("smoothing", "1.5")),
        Case(P, "ProgressiveResizing(initial_scale=0)", "refuse", python(lambda: ProgressiveResizing(initial_scale=0)), ("initial_scale",)),
        Case(P, "SelectiveBackprop(keep=0)", "refuse", python(lambda: SelectiveBackprop(keep=0)), ("keep",)),
        Case(P, "adamw(betas=(1.2, 0.9))", "refuse", python(lambda: optim.adamw(0.1, betas=(1.2, 0.9))), ("betas",)),
        Case(P, "adamw(weight_decay=-1)", "refuse", python(lambda: optim.adamw(0.1, weight_decay=-1)), ("weight_decay",)),
        Case(P, "CosineAnnealingWithWarmupScheduler(t_warmup='2xx')", "refuse", python(lambda: optim.CosineAnnealingWithWarmupScheduler(t_warmup="2xx")), ("t_warmup", "2xx")),
        Case(P, "mixup_batch of 3-d images", "accept", python(lambda: F.mixup_batch(rows[0][:, None, :], rows[1], num_classes=2, key=R.key(0)))),
        Case(P, "mixup_batch of class indices without num_classes", "refuse", python(lambda: F.mixup_batch(rows[0], rows[1], key=R.key(0))), ("num_classes",)),
        Case(P, "cutmix_batch of flat inputs", "refuse", python(lambda: F.cutmix_batch(rows[0], rows[1], num_classes=2, key=R.key(0))), ("input",)),
        Case(P, "smooth_labels(smoothing=-0.1)", "refuse", python(lambda: F.smooth_labels(torch.zeros(2, 3), torch.tensor([0, 1]), smoothing=-0.1)), ("smoothing",)),
        Case(P, "R.key(2**70)", "refuse", python(lambda: R.key(2**70)), ("seed",)),
        Case(P, "R.normal with a float key", "refuse", python(lambda: R.normal(0.5, (2,))), ("key",)),
        Case(P, "predict() of a loader of other features", "refuse", python(lambda: _fitted_predict(trainer, R.normal(R.key(7), (8, 5)))), ("(8, 5)", "(B, 6)")),
    ]


def _fitted_predict(trainer: Callable[..., Any], inputs: Any) -> Any:
    run = trainer()
    run.fit()
    return run.predict([(inputs,)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="print every case, not only those that are not right")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="input-sweep-") as tmp:
        folder = Path(tmp)
        places = fixtures(folder)
        found = []
        for case in cases(places, folder):
            outcome, text = case.run()
            found.append((case, outcome, text, classify(case, outcome, text)))
    counts = {kind: sum(1 for *_, verdict in found if verdict == kind) for kind in ("right", "unclear", "silent", "refused")}
    print(f"{len(found)} cases: " + ", ".join(f"{count} {kind}" for kind, count in counts.items()))
    for surface in ("command line", "Python"):
        mine = [verdict for case, *_, verdict in found if case.surface == surface]
        print(f"  {surface}: {len(mine)} cases, " + ", ".join(f"{mine.count(k)} {k}" for k in counts))
    for case, outcome, text, verdict in found:
        if args.all or verdict != "right":
            shown = text.strip().replace("\n", " | ")[:300]
            print(f"[{verdict}] {case.surface}: {case.what} (expected {case.expect}, {outcome}): {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
