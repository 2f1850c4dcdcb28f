"""Step time of Hugging Face GPT-2 and BERT through our Trainer against Composer's Trainer with HuggingFaceModel.

Usage: python benchmarks/hf_step_time.py [--threads 2] [--rounds 3] [--ours-transformers PATH] [--json PATH]

Both sides train the same model (built from one config, the same initial weights) on the same batches in the
same order: GPT-2 for causal LM and BERT for masked LM, width 128, 2 layers, 4 heads, 8 rows of 128 tokens
padded on the right (``attention_mask``, labels ``-100`` at the pads and, for BERT, at 85% of the tokens),
AdamW (lr 1e-4), fp32, eager, dropout as the configs default it (0.1), no metrics, loggers, evaluation or
progress bar. Ours: ``Trainer(model, batches, optimizer=optim.adamw(1e-4))`` (the batch as keyword arguments,
the model's own loss). Composer 0.32.1: ``Trainer(model=HuggingFaceModel(model, use_logits=True),
optimizers=torch.optim.AdamW(...), device_train_microbatch_size=8)``.

Composer needs ``transformers`` older than 4.54 (``pip install transformers==4.51.3`` into the peer
environment). The two sides must run the same ``transformers``, or the figure measures its versions:
``--ours-transformers`` puts a folder holding that version first on our path (``pip install --target PATH
--no-deps transformers==4.51.3 huggingface_hub==0.36.2 tokenizers==0.21.4``); both versions are printed.

Per-step time is marginal: ``(t(3 epochs) - t(1 epoch)) / 16 steps``, each ``fit`` on a fresh trainer built
outside the timing, so start-up cancels. Rounds alternate ours and Composer's; the table shows medians and
the ratio. Target: ours / Composer ≤ 1.0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peer-python", default=None)
    parser.add_argument("--ours-transformers", default=None)
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args()


ARGS = _arguments() if __name__ == "__main__" else None
if ARGS is not None and ARGS.ours_transformers:
    sys.path.insert(0, ARGS.ours_transformers)

import torch  # noqa: E402
from _peer import Peer, find_peer_python, format_table, pin_threads, write_json  # noqa: E402

from composer_fn import optim  # noqa: E402
from composer_fn.trainer import Trainer  # noqa: E402

ROWS, LENGTH, STEPS_PER_EPOCH, VOCAB = 8, 128, 8, 1000
EPOCHS = (1, 3)
MODELS = ("gpt2", "bert")

PEER_SOURCE = r"""
import time, torch, transformers

def setup():
    torch.set_num_threads(THREADS)
    global Trainer, HuggingFaceModel
    import composer
    from composer import Trainer
    from composer.models import HuggingFaceModel
    return {"composer": composer.__version__, "transformers": transformers.__version__, "torch": torch.__version__}

def prepare(path):
    global DATA
    DATA = torch.load(path)
    return True

class Batches(torch.utils.data.Dataset):
    def __init__(self, name):
        self.batches = DATA[name]["batches"]
    def __len__(self):
        return len(self.batches)
    def __getitem__(self, index):
        return self.batches[index]

def _model(name):
    config = getattr(transformers, DATA[name]["config_class"])(**DATA[name]["config"])
    model = getattr(transformers, DATA[name]["model_class"])(config)
    model.load_state_dict(DATA[name]["init"])
    return model

def fit(model_name, epochs):
    name = model_name
    model = HuggingFaceModel(_model(name), use_logits=True)
    trainer = Trainer(
        model=model, train_dataloader=torch.utils.data.DataLoader(Batches(name), batch_size=None),
        max_duration=f"{epochs}ep", optimizers=torch.optim.AdamW(model.parameters(), lr=1e-4),
        device="cpu", progress_bar=False, log_to_console=False, loggers=[], seed=0,
        device_train_microbatch_size=len(DATA[name]["batches"][0]["input_ids"]),
    )
    start = time.perf_counter()
    trainer.fit()
    elapsed = time.perf_counter() - start
    trainer.close()
    return elapsed
"""


def _cases() -> dict[str, dict[str, Any]]:
    import transformers

    generator = torch.Generator().manual_seed(0)
    cases: dict[str, dict[str, Any]] = {}
    configs = {
        "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=VOCAB, n_embd=128, n_layer=2, n_head=4, n_positions=LENGTH)),
        "bert": (
            "BertConfig",
            "BertForMaskedLM",
            dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                 max_position_embeddings=LENGTH),
        ),
    }  # fmt: skip
    for name, (config_class, model_class, config) in configs.items():
        batches = []
        for _ in range(STEPS_PER_EPOCH):
            ids = torch.randint(1, VOCAB, (ROWS, LENGTH), generator=generator)
            lengths = torch.randint(LENGTH // 2, LENGTH + 1, (ROWS,), generator=generator)
            mask = (torch.arange(LENGTH) < lengths[:, None]).long()
            ids = ids.masked_fill(mask == 0, 0)
            labels = ids.masked_fill(mask == 0, -100)
            if name == "bert":
                labels = labels.masked_fill(torch.rand(ROWS, LENGTH, generator=generator) > 0.15, -100)
            batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
        torch.manual_seed(0)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
        cases[name] = {
            "config_class": config_class,
            "model_class": model_class,
            "config": config,
            "init": model.state_dict(),
            "batches": batches,
        }
    return cases


def _ours(case: dict[str, Any], epochs: int) -> float:
    import transformers

    model = getattr(transformers, case["model_class"])(
        getattr(transformers, case["config_class"])(**case["config"])
    )
    model.load_state_dict(case["init"])
    trainer = Trainer(
        model, case["batches"], max_duration=f"{epochs}ep", optimizer=optim.adamw(learning_rate=1e-4), seed=0,
        progress_bar=False,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - start


def main() -> None:
    args = ARGS
    assert args is not None
    pin_threads(args.threads)
    import transformers

    python = find_peer_python(args.peer_python)
    if python is None:
        sys.exit("no peer environment: build it with ../shared/tools/peer-env.sh")
    cases = _cases()
    steps = (EPOCHS[1] - EPOCHS[0]) * STEPS_PER_EPOCH
    per_step: dict[str, dict[str, list[float]]] = {m: {"ours": [], "composer": []} for m in MODELS}
    with (
        tempfile.TemporaryDirectory() as folder,
        Peer(python, PEER_SOURCE, threads=args.threads, timeout=900).start() as peer,
    ):
        path = str(Path(folder) / "cases.pt")
        torch.save(cases, path)
        info = peer.wait_ready()
        peer.call("prepare", path=path)
        for name in MODELS:  # warm-up: first calls pay for imports and allocator growth
            _ours(cases[name], 1)
            peer.call("fit", model_name=name, epochs=1)
        for round_index in range(args.rounds):
            for name in MODELS:
                sides = ["ours", "composer"] if round_index % 2 == 0 else ["composer", "ours"]
                for side in sides:
                    if side == "ours":
                        short, long = _ours(cases[name], EPOCHS[0]), _ours(cases[name], EPOCHS[1])
                    else:
                        short = peer.call("fit", model_name=name, epochs=EPOCHS[0])
                        long = peer.call("fit", model_name=name, epochs=EPOCHS[1])
                    per_step[name][side].append((long - short) / steps)
    print(
        f"ours: transformers {transformers.__version__}, torch {torch.__version__}; peer: Composer {info['composer']}, "
        f"transformers {info['transformers']}, torch {info['torch']}; {args.threads} threads, {args.rounds} rounds"
    )
    rows = []
    results: dict[str, Any] = {}
    for name in MODELS:
        ours, theirs = (
            statistics.median(per_step[name]["ours"]),
            statistics.median(per_step[name]["composer"]),
        )
        results[name] = {
            "ours_s": per_step[name]["ours"],
            "composer_s": per_step[name]["composer"],
            "ratio": ours / theirs,
        }
        rows.append([name, f"{ours * 1e3:.1f}", f"{theirs * 1e3:.1f}", f"{ours / theirs:.3f}"])
    print(format_table(["model", "ours ms/step", "Composer ms/step", "ours / Composer"], rows))
    if args.json is not None:
        write_json(args.json, {"results": results, "peer": info, "transformers": transformers.__version__})


if __name__ == "__main__":
    main()
