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
    ]


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
