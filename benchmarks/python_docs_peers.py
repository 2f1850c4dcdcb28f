"""The Python documentation corpus, same run, three ways: our Trainer (``composer-fn train`` on a recipe file),
MosaicML Composer's Trainer (its ``HuggingFaceModel``, its algorithms) and a hand-written PyTorch loop.

All three train the same ``GPT2LMHeadModel`` (the recipe's configuration and the same initial weights, drawn by
``build_causal_lm`` from the seed) on the same rows (``load_text_corpus``: the recipe's tokenizer and row length),
in the same order (the epoch orders of our ``DatasetLoader`` for the seed, handed to the others as index lists),
with AdamW (the recipe's betas and decay, applied to every parameter as ``torch.optim.AdamW`` does) and the
recipe's warm-up and cosine decay, stepped every batch. The held-out loss is the mean next-token cross-entropy
over every held-out token, computed the same way for the three after training; perplexity is its ``exp``.

Two measurements:

- ``--timing``: the baseline for ``--steps`` steps per contender, ``--rounds`` rounds in rotating order; the
  training wall time per step (evaluation excluded), and the held-out perplexity.
- ``--recipe FILE``: the recipe's methods on our Trainer and, translated one for one, on Composer's Trainer
  (``--seeds`` each, ``--steps`` steps, scaled by the recipe's ``scale_schedule_ratio``; a compiled step as
  Composer's ``compile_config={}``); held-out perplexity and training wall time. A method Composer's Trainer
  refuses for the model is reported as refused. The hand loop runs the baseline only.

Composer runs in its own interpreter (``../shared/tools/peer-env.sh`` builds it; this script adds the
``transformers`` release Composer 0.32.1 supports to it, once, when it is missing); without it the Composer column
is skipped. Both cores by default (``--threads 2``); run it alone on the machine.

    .venv/bin/python benchmarks/python_docs_peers.py --timing --steps 100 --rounds 2
    .venv/bin/python benchmarks/python_docs_peers.py --recipe recipes/python-docs-mild.toml --steps 693 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
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
BASELINE = ROOT / "recipes" / "python-docs-baseline.toml"
PEER_TRANSFORMERS = "transformers>=4.40,<4.52"  # the releases Composer 0.32.1's HuggingFaceModel supports

# Defined in both interpreters: the model from its configuration, the schedule, the held-out loss and the hand loop.
SHARED = r'''
import math, time
import torch
import torch.nn.functional as F


def language_model(data):
    import transformers

    config = transformers.GPT2Config(**data["config"])
    model = transformers.GPT2LMHeadModel(config)
    missing, unexpected = model.load_state_dict(data["init"], strict=False)
    left = [name for name in missing if not name.endswith((".attn.bias", ".attn.masked_bias"))]
    if left or unexpected:
        raise RuntimeError(f"the initial weights do not fit: missing {left}, unexpected {unexpected}")
    return model


def multiplier(step, total, warmup):
    if step < warmup:
        return step / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def batches(data, steps, batch_size):
    """The rows of each step, epoch after epoch in the given orders."""
    done = 0
    for order in data["orders"]:
        for begin in range(0, len(order) - batch_size + 1, batch_size):
            if done == steps:
                return
            yield order[begin:begin + batch_size]
            done += 1
    raise RuntimeError(f"{steps} steps need more epoch orders than the {len(data['orders'])} given")


def heldout_loss(model, rows, batch_size=64):
    """The mean next-token cross-entropy over every held-out token."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for begin in range(0, len(rows), batch_size):
            ids = rows[begin:begin + batch_size]
            logits = model(input_ids=ids).logits[:, :-1].float()
            total += float(F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="sum"))
            count += ids[:, 1:].numel()
    model.train()
    return total / count


def hand_loop(data, steps, lr, betas, weight_decay, warmup, batch_size, lag=False):
    # lag: step t trains at the multiplier of step t - 1, as Composer's Trainer does (it steps its schedulers at the
    # end of a batch, before advancing the timestamp its schedule reads).
    model = language_model(data)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    shift = 1 if lag else 0
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: multiplier(max(t - shift, 0), steps, warmup * steps))
    rows = data["rows"]
    model.train()
    started = time.perf_counter()
    for index in batches(data, steps, batch_size):
        ids = rows[index]
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
    wall = time.perf_counter() - started
    return {"wall_time": wall, "loss": heldout_loss(model, data["heldout"])}
'''

PEER = (
    SHARED
    + r"""
_DATA = {}


def setup():
    import composer
    import transformers
    return {"composer": composer.__version__, "transformers": transformers.__version__}


def _data(path):
    if path not in _DATA:
        _DATA.clear()
        _DATA[path] = torch.load(path)
    return _DATA[path]


def peer_hand_loop(path, **kwargs):
    return hand_loop(_data(path), **kwargs)


class Rows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]

    def __getitems__(self, indices):
        ids = self.rows[torch.tensor(indices)]
        return {"input_ids": ids, "labels": ids.clone()}


class Orders:
    def __init__(self, data, steps, batch_size):
        self.data, self.steps, self.batch_size = data, steps, batch_size

    def __iter__(self):
        for index in batches(self.data, self.steps, self.batch_size):
            yield index.tolist()

    def __len__(self):
        return self.steps


def composer_run(path, steps, lr, betas, weight_decay, warmup, batch_size, seed, algorithms, compile_config=None):
    import composer.algorithms as ca
    from composer import Trainer
    from composer.models import HuggingFaceModel
    from composer.optim import CosineAnnealingWithWarmupScheduler

    data = _data(path)
    module = language_model(data)
    train = torch.utils.data.DataLoader(
        Rows(data["rows"]), batch_sampler=Orders(data, steps, batch_size), collate_fn=lambda batch: batch
    )
    model = HuggingFaceModel(module, tokenizer=None, use_logits=True)
    trainer = Trainer(
        model=model, train_dataloader=train, max_duration=f"{steps}ba",
        optimizers=torch.optim.AdamW(model.parameters(), lr=lr, betas=tuple(betas), weight_decay=weight_decay),
        schedulers=CosineAnnealingWithWarmupScheduler(t_warmup=f"{warmup}dur"), step_schedulers_every_batch=True,
        algorithms=[getattr(ca, name)(**options) for name, options in algorithms],
        device="cpu", device_train_microbatch_size=batch_size, seed=seed, progress_bar=False,
        log_to_console=False, loggers=[], compile_config=compile_config,
    )
    started = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - started
    # The evaluation weights: EMA's average when the recipe keeps one (Composer swaps it in at the end of fit).
    return {"wall_time": wall, "loss": heldout_loss(model.model, data["heldout"])}
"""
)

# Our algorithm names and Composer's classes: the options carry over by name.
COMPOSER_NAMES = {
    "alibi": "Alibi",
    "seq_length_warmup": "SeqLengthWarmup",
    "gated_linear_units": "GatedLinearUnits",
    "low_precision_layernorm": "LowPrecisionLayerNorm",
    "selective_backprop": "SelectiveBackprop",
    "label_smoothing": "LabelSmoothing",
    "ema": "EMA",
}


def _recipe(path: Path) -> dict[str, Any]:
    from composer_fn.app.recipes import recipe_fields

    return recipe_fields(path)


def _options(text: str) -> dict[str, object]:
    from composer_fn.app.cli import _model_kwargs

    options = _model_kwargs(text)
    if options is None:
        raise SystemExit(f"model_kwargs={text!r}: expected comma-separated name=value pairs")
    return options


def prepare(folder: Path, recipe: dict[str, Any], seed: int, steps: int) -> Path:
    """Writes what every contender trains on to ``folder/data-<seed>.pt``: rows, held-out rows, the epoch orders of
    ``steps`` steps, the configuration and the initial weights."""
    from composer_fn.core import random as R
    from composer_fn.data.corpus import load_text_corpus
    from composer_fn.data.loader import epoch_order
    from composer_fn.models.hf_lm import build_causal_lm

    corpus = load_text_corpus(recipe["data"], sequence_length=int(recipe["sequence_length"]), tokenizer=recipe["tokenizer"])
    rows = torch.tensor(corpus.train["input_ids"], dtype=torch.int64)
    heldout = torch.tensor(corpus.heldout["input_ids"], dtype=torch.int64)
    epochs = math.ceil(steps / (len(rows) // int(recipe["batch_size"])))
    model = build_causal_lm(
        recipe["model"], corpus.vocab_size, corpus.sequence_length, key=R.key(seed),
        options=_options(recipe.get("model_kwargs", "")), end_of_text=corpus.end_of_text,
    )  # fmt: skip
    orders = torch.stack([epoch_order(R.key(seed), e, len(rows), True) for e in range(epochs)])
    config = {k: v for k, v in model.config.to_dict().items() if k in _GPT2_FIELDS}
    path = folder / f"data-{seed}.pt"
    torch.save({"rows": rows, "heldout": heldout, "orders": orders, "config": config, "init": model.state_dict()}, path)
    return path


_GPT2_FIELDS = (
    "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function", "resid_pdrop",
    "embd_pdrop", "attn_pdrop", "layer_norm_epsilon", "initializer_range", "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "bos_token_id", "eos_token_id", "tie_word_embeddings",
)  # fmt: skip


def ours(recipe: Path, folder: Path, steps: int, seed: int, threads: int) -> dict[str, float]:
    """Trains the recipe with ``composer-fn train`` in this process for ``steps`` steps (scaled by the recipe's
    ``scale_schedule_ratio``); returns its training wall time (its last training record, before the evaluation), its
    held-out loss and the steps it trained."""
    from composer_fn.app.cli import main

    log = folder / f"ours-{time.monotonic_ns()}.jsonl"
    trained_steps = int(float(_recipe(recipe).get("scale_schedule_ratio", 1.0)) * steps)  # as the Trainer scales it
    argv = ["train", "--config", str(recipe), "--max-duration", f"{steps}ba", "--eval-interval", f"{trained_steps}ba",
            "--log-interval", f"{trained_steps}ba", "--seed", str(seed), "--threads", str(threads), "--log-file", str(log),
            "--no-progress"]  # fmt: skip
    if main(argv) != 0:
        raise RuntimeError(f"composer-fn {' '.join(argv)} failed")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    trained = [r for r in records if r.get("kind") == "train"][-1]
    last = [r for r in records if r.get("kind") == "eval"][-1]
    return {"wall_time": float(trained["wall_time"]), "loss": float(last["eval/eval/loss"]), "steps": int(trained["step"])}


def composer_algorithms(recipe: dict[str, Any]) -> list[list[Any]]:
    """Returns the recipe's methods as Composer's classes and options."""
    found = []
    for name, options in recipe.get("algorithms", {}).items():
        if name not in COMPOSER_NAMES:
            raise SystemExit(f"--recipe: {name} has no Composer counterpart here; expected among {sorted(COMPOSER_NAMES)}")
        found.append([COMPOSER_NAMES[name], dict(options)])
    if recipe.get("precision", "fp32") != "fp32":
        raise SystemExit("--recipe: a precision other than fp32 has no CPU counterpart on Composer's Trainer here")
    return found


def ensure_transformers(python: str) -> None:
    """Installs the ``transformers`` release Composer supports into the peer environment when it has none."""
    if subprocess.call([python, "-c", "import transformers"], stderr=subprocess.DEVNULL) == 0:
        return
    print(f"installing {PEER_TRANSFORMERS} into the peer environment ({python}) ...", flush=True)
    subprocess.check_call([python, "-m", "pip", "install", "-q", PEER_TRANSFORMERS])


def _hand(
    namespace: dict[str, Any], data: dict[str, Any], steps: int, optimizer: dict[str, Any], warmup: float, batch: int,
    lag: bool = False,
) -> Any:
    return namespace["hand_loop"](
        data, steps=steps, lr=optimizer["learning_rate"], betas=optimizer["betas"],
        weight_decay=optimizer["weight_decay"], warmup=warmup, batch_size=batch, lag=lag,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timing", action="store_true", help="time the baseline on the three trainers")
    parser.add_argument("--recipe", type=Path, default=None, help="compare this recipe on ours and Composer's")
    parser.add_argument("--steps", type=int, default=100, help="steps per run (default 100)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the timing (default 2)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of the recipe runs (default 0)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results here")
    parser.add_argument("--peer-python", default=None, metavar="PATH", help="the peer environment's python")
    args = parser.parse_args(argv)
    if not (args.timing or args.recipe):
        parser.error("give --timing, --recipe FILE or both")
    pin_threads(args.threads)
    base = _recipe(BASELINE)
    optimizer, batch = base["optimizer"], int(base["batch_size"])
    warmup = float(base["schedule"]["t_warmup"].removesuffix("dur"))
    python = find_peer_python(args.peer_python)
    peer = None
    if python:
        ensure_transformers(python)
        peer = Peer(python, PEER, threads=args.threads, timeout=7200.0).start()
    namespace: dict[str, Any] = {"__name__": "shared"}
    exec(compile(SHARED, "<shared>", "exec"), namespace)
    results: dict[str, Any] = {"environment": environment(args.threads)}
    with tempfile.TemporaryDirectory(prefix="python-docs-peers-") as tmp:
        folder = Path(tmp)
        data_path = prepare(folder, base, 0, args.steps)
        data = torch.load(data_path)
        if peer is not None:
            try:
                results["peer"] = peer.wait_ready()
            except PeerError as error:
                print(f"Composer column skipped: {error}")
                peer = None
        common = {"steps": args.steps, "lr": optimizer["learning_rate"], "betas": optimizer["betas"],
                  "weight_decay": optimizer["weight_decay"], "warmup": warmup, "batch_size": batch}  # fmt: skip
        if args.timing:
            contenders = {
                "composer_fn Trainer": lambda: ours(BASELINE, folder, args.steps, 0, args.threads),
                "hand loop": lambda: _hand(namespace, data, args.steps, optimizer, warmup, batch),
            }
            if peer is not None:
                contenders["Composer Trainer"] = lambda: peer.call(
                    "composer_run", path=str(data_path), seed=0, algorithms=[], **common
                )
                # The hand loop with Composer's schedule timing: its held-out loss is Composer's, which explains
                # the difference in the column above.
                contenders["hand loop, lagged schedule"] = lambda: _hand(namespace, data, args.steps, optimizer, warmup, batch, True)
            samples = rotated_rounds(contenders, args.rounds)
            per_step = {name: statistics.median(s["wall_time"] for s in runs) / args.steps for name, runs in samples.items()}
            rows = [
                [name, f"{1000 * per_step[name]:.1f}", f"{per_step['composer_fn Trainer'] / per_step[name]:.3f}",
                 " ".join(f"{math.exp(s['loss']):.2f}" for s in runs)]
                for name, runs in samples.items()
            ]  # fmt: skip
            print(f"\nBaseline, {args.steps} steps per run, {args.rounds} rounds, {args.threads} threads")
            print(format_table(["trainer", "ms/step (median)", "ours / this", "held-out perplexity"], rows))
            results["timing"] = samples
        if args.recipe:
            recipe = _recipe(args.recipe)
            algorithms = composer_algorithms(recipe)
            runs: dict[str, list[dict[str, float]]] = {"composer_fn Trainer": [], "Composer Trainer": []}
            recipe_optimizer = recipe["optimizer"]
            # torch.compile on Composer's Trainer: its compile_config, inductor's defaults as ours.
            compile_config = {} if recipe.get("compile") else None
            for seed in args.seeds:
                runs["composer_fn Trainer"].append(ours(args.recipe, folder, args.steps, seed, args.threads))
                print(f"ours seed {seed}: {runs['composer_fn Trainer'][-1]}", flush=True)
                if peer is not None:
                    # A recipe with a scale_schedule_ratio trains that share of --steps: Composer's run trains the
                    # steps ours did, its schedule over them.
                    steps = runs["composer_fn Trainer"][-1]["steps"]
                    seeded = prepare(folder, recipe, seed, steps)
                    try:
                        runs["Composer Trainer"].append(peer.call(
                            "composer_run", path=str(seeded), seed=seed, algorithms=algorithms,
                            compile_config=compile_config,
                            **{**common, "steps": steps, "lr": recipe_optimizer["learning_rate"]},
                        ))  # fmt: skip
                    except PeerError as error:  # a method Composer's Trainer does not apply to this model
                        refused = str(error).splitlines()[-1]
                        print(f"Composer seed {seed}: refused: {refused}", flush=True)
                        results.setdefault("refused", {})[seed] = refused
                        continue
                    print(f"Composer seed {seed}: {runs['Composer Trainer'][-1]}", flush=True)
            steps = runs["composer_fn Trainer"][-1]["steps"]
            print(f"\n{args.recipe.name}, {steps} steps, seeds {args.seeds}: Composer's algorithms {algorithms}, "
                  f"compile_config {compile_config}")
            rows = []
            for name, found in runs.items():
                if found:
                    perplexities = [math.exp(r["loss"]) for r in found]
                    spread = statistics.stdev(perplexities) if len(perplexities) > 1 else 0.0
                    rows.append([name, f"{statistics.fmean(perplexities):.2f} ± {spread:.2f}",
                                 f"{statistics.fmean(r['wall_time'] for r in found):.1f}"])  # fmt: skip
            for refused in sorted(set(results.get("refused", {}).values())):
                rows.append(["Composer Trainer", f"refused: {refused}", "-"])
            print(format_table(["trainer", "held-out perplexity (mean ± std)", "training wall time (s, mean)"], rows))
            results["recipe"] = {"file": str(args.recipe), "steps": args.steps, "runs": runs}
    if peer is not None:
        peer.close()
    if args.json:
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
