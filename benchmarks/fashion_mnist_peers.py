"""Fashion-MNIST, same run, three ways: our Trainer (``composer-fn train`` on the recipe file), MosaicML
Composer's Trainer with Composer's algorithms, and a hand-written PyTorch loop.

All three train the same network (``two_conv_bn`` width 16, hidden 256: the same module and the same initial
weights, drawn by ``build_model`` from the seed), on the same standardised images, in the same order (the epoch
orders of our ``TensorLoader`` for the seed, handed to the others as index lists), with the baseline's random
crop (its padding, 0 since the padding grid; black fill) and flip of each image, SGD with Nesterov momentum and
weight decay, and the cosine schedule with a warm-up of a tenth of the run. Only the draws of the crops and
flips (and dropout) differ: ours come from the seed's key, theirs from a seeded ``torch.Generator``.

Two measurements:

- ``--timing``: the baseline for ``--epochs`` epochs per contender, ``--rounds`` rounds in rotating order; the
  wall time of ``fit`` (its one evaluation included) over the epochs, and the held-out accuracy.
- ``--recipe FILE``: the recipe's methods on our Trainer and, translated one for one, on Composer's Trainer
  (``--seeds`` each, at ``--scale-schedule-ratio``); accuracies and wall times. A recipe in bf16 autocast
  (``precision = "bf16-mixed"``) runs on Composer's Trainer with the network's forward wrapped in CPU autocast,
  since that Trainer refuses ``precision="amp_bf16"`` on a CPU. The hand loop runs the baseline only.

The peer runs in its own interpreter (``../shared/tools/peer-env.sh`` builds it); without it the Composer column
is skipped. Both cores by default (``--threads 2``); run it alone on the machine.

    .venv/bin/python benchmarks/fashion_mnist_peers.py --timing --epochs 1 --rounds 2
    .venv/bin/python benchmarks/fashion_mnist_peers.py --recipe recipes/fashion-mnist-hot.toml --scale-schedule-ratio 0.4
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _peer import (
    Peer,
    PeerError,
    environment,
    find_peer_python,
    format_table,
    pin_threads,
    rotated_rounds,
    write_json,
)

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "recipes" / "fashion-mnist-baseline.toml"

# Defined in both interpreters: the plain-PyTorch network (our TwoConvBN's layers and parameter names, torch's
# dropout), the batch crop and flip, the schedule, the loaders and the hand loop.
SHARED = r'''
import math, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class TwoConvBN(nn.Module):
    def __init__(self, width=16, hidden=256, dropout=0.4, side=7):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 5, padding=2, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 5, padding=2, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.side, self.pool = side, nn.AdaptiveAvgPool2d(side)
        self.hidden = nn.Linear(2 * width * side * side, hidden)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):
        maps = self.features(x)
        if maps.shape[-2:] != (self.side, self.side):
            maps = self.pool(maps)
        return self.head(self.dropout(torch.relu(self.hidden(maps.flatten(1)))))


def crop_flip(x, generator, padding, fill):
    b, _, h, w = x.shape
    offsets = torch.randint(0, 2 * padding + 1, (b, 2), generator=generator)
    flips = torch.rand(b, generator=generator) < 0.5
    padded = F.pad(x, (padding,) * 4, value=fill)
    rows = offsets[:, 0, None] + torch.arange(h)
    cols = offsets[:, 1, None] + torch.arange(w)
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    out = padded.gather(2, rows[:, None, :, None].expand(-1, padded.shape[1], -1, padded.shape[3]))
    return out.gather(3, cols[:, None, None, :].expand(-1, padded.shape[1], h, -1))


def multiplier(step, total, warmup):
    if step < warmup:
        return step / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


class Orders:
    """Batches of each epoch's order; an epoch per pass."""

    def __init__(self, orders, batch_size):
        self.orders, self.batch_size, self.epoch = orders, batch_size, 0

    def __iter__(self):
        order = self.orders[self.epoch % len(self.orders)]
        self.epoch += 1
        for begin in range(0, len(order), self.batch_size):
            yield order[begin:begin + self.batch_size].tolist()

    def __len__(self):
        return math.ceil(len(self.orders[0]) / self.batch_size)


class Rows(torch.utils.data.Dataset):
    """A whole batch of rows per fetch (``__getitems__``), so the loader does not collate sample by sample."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __getitems__(self, indices):
        index = torch.tensor(indices)
        return self.x[index], self.y[index]


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        right = sum(int((model(x[i:i + 512]).argmax(1) == y[i:i + 512]).sum()) for i in range(0, len(y), 512))
    model.train()
    return right / len(y)


def hand_loop(data, epochs, lr, batch_size, seed, padding, fill):
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = TwoConvBN()
    model.load_state_dict(data["init"])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    steps = epochs * math.ceil(len(data["y"]) / batch_size)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: multiplier(t, steps, 0.1 * steps))
    x, y = data["x"], data["y"]
    started = time.perf_counter()
    for epoch in range(epochs):
        order = data["orders"][epoch]
        for begin in range(0, len(order), batch_size):
            index = order[begin:begin + batch_size]
            loss = F.cross_entropy(model(crop_flip(x[index], generator, padding, fill)), y[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    right = accuracy(model, data["heldout_x"], data["heldout_y"])
    return {"wall_time": time.perf_counter() - started, "accuracy": right}
'''

PEER = (
    SHARED
    + r"""
_DATA = {}


def setup():
    import composer
    return {"composer": composer.__version__}


def _data(path):
    if path not in _DATA:
        _DATA.clear()
        _DATA[path] = torch.load(path)
    return _DATA[path]


def peer_hand_loop(path, **kwargs):
    return hand_loop(_data(path), **kwargs)


# Runs the module under CPU bf16 autocast: Composer's Trainer refuses precision="amp_bf16" on a CPU ("not supported
# for CPU training"), so a bf16 recipe reaches it as a wrapper of the model's forward.
class CPUAutocast(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.module(x).float()


def composer_run(path, epochs, ratio, lr, batch_size, seed, padding, fill, algorithms, autocast=False):
    import composer.algorithms as ca
    from composer import Trainer
    from composer.models import ComposerClassifier
    from composer.optim import CosineAnnealingWithWarmupScheduler

    data = _data(path)
    generator = torch.Generator().manual_seed(seed)
    module = TwoConvBN()
    module.load_state_dict(data["init"])
    train = torch.utils.data.DataLoader(
        Rows(data["x"], data["y"]), batch_sampler=Orders(data["orders"], batch_size),
        collate_fn=lambda rows: (crop_flip(rows[0], generator, padding, fill), rows[1]),
    )
    heldout = torch.utils.data.DataLoader(
        Rows(data["heldout_x"], data["heldout_y"]), batch_size=512, collate_fn=lambda rows: rows
    )
    model = ComposerClassifier(CPUAutocast(module) if autocast else module, num_classes=10)
    trainer = Trainer(
        model=model, train_dataloader=train, eval_dataloader=heldout, max_duration=f"{epochs}ep",
        scale_schedule_ratio=ratio, eval_interval=f"{max(1, round(epochs * ratio))}ep",
        optimizers=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4),
        schedulers=CosineAnnealingWithWarmupScheduler(t_warmup="0.1dur"), step_schedulers_every_batch=True,
        algorithms=[getattr(ca, name)(**options) for name, options in algorithms],
        device="cpu", device_train_microbatch_size=batch_size, seed=seed, progress_bar=False,
        log_to_console=False, loggers=[],
    )
    started = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - started
    metric = trainer.state.eval_metrics["eval"]["MulticlassAccuracy"].compute()
    return {"wall_time": wall, "accuracy": float(metric)}
"""
)

# Our algorithm names and Composer's classes: the options carry over by name (the cards list the few that differ).
COMPOSER_NAMES = {
    "label_smoothing": "LabelSmoothing",
    "ema": "EMA",
    "swa": "SWA",
    "mixup": "MixUp",
    "cutmix": "CutMix",
    "blurpool": "BlurPool",
    "channels_last": "ChannelsLast",
    "progressive_resizing": "ProgressiveResizing",
    "selective_backprop": "SelectiveBackprop",
    "layer_freezing": "LayerFreezing",
    "sam": "SAM",
    "squeeze_excite": "SqueezeExcite",
}


def _recipe(path: Path) -> dict[str, Any]:
    from composer_fn.app.recipes import recipe_fields

    return recipe_fields(path)


def prepare(folder: Path, recipe: dict[str, Any], seed: int, epochs: int, limit: int | None = None) -> Path:
    """Writes what every contender trains on to ``folder/data.pt``: images, labels, epoch orders, initial weights."""
    from composer_fn.core import random as R
    from composer_fn.data import load_dataset
    from composer_fn.data.loader import epoch_order
    from composer_fn.models.zoo import build_model

    task = load_dataset("fashion-mnist")
    (x, y), (hx, hy) = task.train, task.heldout
    if limit:
        x, y, hx, hy = x[:limit], y[:limit], hx[:limit], hy[:limit]
    options = dict(item.split("=") for item in recipe["model_kwargs"].split(","))
    model = build_model(
        recipe["model"], (1, 28, 28), 10, key=R.key(seed), options={k: int(v) for k, v in options.items()}
    )
    orders = torch.stack([epoch_order(R.key(seed), e, len(y), True) for e in range(epochs)])
    path = folder / f"data-{seed}.pt"
    torch.save(
        {"x": x, "y": y, "heldout_x": hx, "heldout_y": hy, "orders": orders, "init": model.state_dict()}, path
    )
    return path


def ours(
    recipe: Path, folder: Path, epochs: int | None, ratio: float | None, seed: int, threads: int
) -> dict[str, float]:
    """Trains the recipe with ``composer-fn train`` in this process; returns its fit wall time and accuracy."""
    from composer_fn.app.cli import main

    log = folder / f"ours-{time.monotonic_ns()}.jsonl"
    length = ["--max-duration", f"{epochs}ep"] if epochs else ["--scale-schedule-ratio", str(ratio)]
    evals = ["--eval-interval", f"{epochs}ep"] if epochs else []
    argv = ["train", "--config", str(recipe), *length, *evals, "--seed", str(seed), "--threads", str(threads),
            "--log-file", str(log), "--no-progress"]  # fmt: skip
    if main(argv) != 0:
        raise RuntimeError(f"composer-fn {' '.join(argv)} failed")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    fit = [r for r in records if r.get("kind") == "fit"][-1]
    last = [r for r in records if r.get("kind") == "eval"][-1]
    return {"wall_time": float(fit["wall_time"]), "accuracy": float(last["eval/eval/accuracy"])}


def composer_algorithms(recipe: dict[str, Any]) -> list[list[Any]]:
    """Returns the recipe's methods as Composer's classes and options (the crop and flip is the loaders' work)."""
    found = []
    for name, options in recipe.get("algorithms", {}).items():
        if name == "random_crop_flip":
            continue
        if name not in COMPOSER_NAMES:
            raise SystemExit(
                f"--recipe: {name} has no Composer counterpart here; expected among {sorted(COMPOSER_NAMES)}"
            )
        found.append([COMPOSER_NAMES[name], dict(options)])
    return found


def bf16_recipe(recipe: dict[str, Any]) -> bool:
    """Returns whether the recipe trains in bf16 autocast (Composer's runs then wrap the forward in it)."""
    precision = recipe.get("precision", "fp32")
    if precision not in ("fp32", "bf16-mixed"):
        raise SystemExit(
            f"--recipe: precision={precision!r} has no CPU counterpart here; expected fp32 or bf16-mixed"
        )
    return precision == "bf16-mixed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timing", action="store_true", help="time the baseline on the three trainers")
    parser.add_argument(
        "--recipe", type=Path, default=None, help="compare this recipe on ours and Composer's"
    )
    parser.add_argument("--epochs", type=int, default=1, help="epochs per timed run (--timing; default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the timing (default 2)")
    parser.add_argument(
        "--scale-schedule-ratio", type=float, default=1.0, help="the recipe's length (--recipe)"
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="seeds of the recipe runs (default 0)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results here")
    parser.add_argument(
        "--limit", type=int, default=None, help="train on the first N images only (a quick check)"
    )
    parser.add_argument("--peer-python", default=None, metavar="PATH", help="the peer environment's python")
    args = parser.parse_args(argv)
    if not (args.timing or args.recipe):
        parser.error("give --timing, --recipe FILE or both")
    pin_threads(args.threads)
    base = _recipe(BASELINE)
    padding = base["algorithms"]["random_crop_flip"]["padding"]
    fill = base["algorithms"]["random_crop_flip"].get("fill", 0.0)
    lr, batch = base["optimizer"]["learning_rate"], base["batch_size"]
    python = find_peer_python(args.peer_python)
    peer = Peer(python, PEER, threads=args.threads, timeout=3600.0).start() if python else None
    namespace: dict[str, Any] = {"__name__": "shared"}
    exec(compile(SHARED, "<shared>", "exec"), namespace)
    results: dict[str, Any] = {"environment": environment(args.threads)}
    with tempfile.TemporaryDirectory(prefix="fashion-peers-") as tmp:
        folder = Path(tmp)
        # An epoch order for every epoch any run trains (a recipe may train longer than the baseline).
        lengths = [args.epochs, 1 + int(_recipe(BASELINE)["max_duration"].removesuffix("ep"))]
        if args.recipe:
            recipe_epochs = int(_recipe(args.recipe)["max_duration"].removesuffix("ep"))
            lengths.append(math.ceil(recipe_epochs * args.scale_schedule_ratio))
        epochs_needed = max(lengths)
        data_path = prepare(folder, base, 0, epochs_needed, args.limit)
        data = torch.load(data_path)
        if peer is not None:
            try:
                results["peer"] = peer.wait_ready()
            except PeerError as error:
                print(f"Composer column skipped: {error}")
                peer = None
        if args.timing:
            common = {
                "epochs": args.epochs,
                "lr": lr,
                "batch_size": batch,
                "seed": 0,
                "padding": padding,
                "fill": fill,
            }
            contenders = {
                "composer_fn Trainer": lambda: ours(BASELINE, folder, args.epochs, None, 0, args.threads),
                "hand loop": lambda: namespace["hand_loop"](data, **common),
            }
            if peer is not None:
                contenders["Composer Trainer"] = lambda: peer.call(
                    "composer_run", path=str(data_path), ratio=1.0, algorithms=[], **common
                )
            samples = rotated_rounds(contenders, args.rounds)
            ours_time = (
                statistics.median(s["wall_time"] for s in samples["composer_fn Trainer"]) / args.epochs
            )
            rows = []
            for name, runs in samples.items():
                per_epoch = statistics.median(s["wall_time"] for s in runs) / args.epochs
                rows.append([
                    name, f"{per_epoch:.2f}", f"{min(s['wall_time'] for s in runs) / args.epochs:.2f}",
                    f"{ours_time / per_epoch:.3f}", " ".join(f"{s['accuracy']:.2%}" for s in runs),
                ])  # fmt: skip
            print(f"\nBaseline, {args.epochs} epoch(s) per run, {args.rounds} rounds, {args.threads} threads")
            print(
                format_table(
                    ["trainer", "s/epoch (median)", "best", "ours / this", "held-out accuracy"], rows
                )
            )
            results["timing"] = samples
        if args.recipe:
            recipe = _recipe(args.recipe)
            algorithms = composer_algorithms(recipe)
            epochs = int(recipe["max_duration"].removesuffix("ep"))
            seed_epochs = max(epochs, math.ceil(epochs * args.scale_schedule_ratio))
            autocast = bf16_recipe(recipe)
            runs: dict[str, list[dict[str, float]]] = {"composer_fn Trainer": [], "Composer Trainer": []}
            for seed in args.seeds:
                runs["composer_fn Trainer"].append(
                    ours(args.recipe, folder, None, args.scale_schedule_ratio, seed, args.threads)
                )
                print(f"ours seed {seed}: {runs['composer_fn Trainer'][-1]}", flush=True)
                if peer is not None:
                    seeded = prepare(folder, recipe, seed, seed_epochs, args.limit) if seed else data_path
                    runs["Composer Trainer"].append(peer.call(
                        "composer_run", path=str(seeded), epochs=epochs, ratio=args.scale_schedule_ratio,
                        lr=recipe["optimizer"]["learning_rate"], batch_size=recipe["batch_size"], seed=seed,
                        padding=padding, fill=fill, algorithms=algorithms, autocast=autocast,
                    ))  # fmt: skip
                    print(f"Composer seed {seed}: {runs['Composer Trainer'][-1]}", flush=True)
            print(f"\n{args.recipe.name} at scale-schedule ratio {args.scale_schedule_ratio}, seeds {args.seeds}: "
                  f"Composer's algorithms {algorithms}{', CPU bf16 autocast' if autocast else ''}")  # fmt: skip
            rows = []
            for name, found in runs.items():
                if found:
                    accuracies = [r["accuracy"] for r in found]
                    spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
                    rows.append([name, f"{statistics.fmean(accuracies):.2%} ± {spread:.2%}",
                                 f"{statistics.fmean(r['wall_time'] for r in found):.1f}"])  # fmt: skip
            print(format_table(["trainer", "held-out accuracy (mean ± std)", "wall time (s, mean)"], rows))
            results["recipe"] = {"file": str(args.recipe), "ratio": args.scale_schedule_ratio, "runs": runs}
    if peer is not None:
        peer.close()
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
