"""A run that does not fit one process: under a per-process memory cap, the Trainer without sharding runs out of
memory, and the same run sharded over two processes (``parallelism=FSDP()``) trains and writes its checkpoint.

The model is the Llama-style one of ``sharded_memory.py`` (``--size``), fp32 with AdamW: one process holds its
parameters, gradients and two AdamW moments, four times the parameters' bytes, while each of two sharded
processes holds half of that. Every process runs under ``--cap`` bytes of private memory (``_memory_cap.py``:
``RLIMIT_DATA``, so a process that crosses it gets its own out-of-memory error), the baseline of ``import torch,
transformers`` (about 800 MiB) included. Three runs, each its own processes:

1. one process without the cap: it trains (the run itself is sound);
2. one process under the cap: out of memory;
3. two sharded processes under the cap each: they train, and the checkpoint they write is complete.

With ``--meta`` the model is built on the meta device: one process makes it whole, sharded processes block by
block, each holding one block's whole tensors at a time.

    .venv/bin/python benchmarks/sharded_fit.py [--size 50m] [--cap 1.5GiB] [--steps 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).parent


def _work(size: str, steps: int, folder: str, sharded: bool, meta: bool) -> None:
    """Trains the model for ``steps`` steps and checkpoints it at the end (a worker: one of the processes); with
    ``meta``, the model is built on the meta device, and the Trainer makes it (a sharded one block by block)."""
    from sharded_memory import BATCH, _batch, _model

    from composer_fn.optim import adamw
    from composer_fn.trainer import FSDP, Trainer

    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    batches = [_batch(step, rank, size) for step in range(steps)]
    with torch.device("meta") if meta else contextlib.nullcontext():
        model = _model(size)
    trainer = Trainer(
        model, batches, max_duration=f"{steps}ba", optimizer=adamw(1e-4), progress_bar=False,
        parallelism=FSDP() if sharded else None, save_folder=folder, save_interval=f"{steps}ba",
    )  # fmt: skip
    trainer.fit()
    if rank == 0:
        print(f"trained {trainer.timestamp.batch} steps of {BATCH * world} samples; saved {sorted(os.listdir(folder))}")


def main() -> None:
    from _memory_cap import describe, parse_size, run_capped

    from composer_fn.trainer.sharded_files import is_sharded_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="50m", help="the model, as sharded_memory.py names it (default 50m)")
    parser.add_argument("--cap", default="1.5GiB", help="private memory each process may hold (default 1.5GiB)")
    parser.add_argument("--steps", type=int, default=2, help="training steps (default 2)")
    parser.add_argument("--meta", action="store_true", help="build the model on the meta device")
    parser.add_argument("--worker", choices=("one", "sharded"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        _work(args.size, args.steps, args.folder, args.worker == "sharded", args.meta)
        return
    cap = parse_size(args.cap)
    script = [str(Path(__file__).resolve()), "--size", args.size, "--steps", str(args.steps), *(["--meta"] if args.meta else [])]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    outcomes = {}
    with tempfile.TemporaryDirectory() as root:
        runs = {
            "one process, uncapped": ([sys.executable, *script, "--worker", "one"], None),
            "one process, capped": ([sys.executable, *script, "--worker", "one"], cap),
            "two sharded processes, capped": ([*torchrun, *script, "--worker", "sharded"], cap),
        }
        for name, (command, limit) in runs.items():
            folder = Path(root, name.replace(" ", "-").replace(",", ""))
            began = time.perf_counter()
            result = run_capped([*command, "--folder", str(folder)], limit or 2**62, timeout=1800.0)
            saved = sorted(path.name for path in folder.iterdir() if path.is_dir() and not path.is_symlink()) if folder.exists() else []
            complete = [name for name in saved if is_sharded_checkpoint(folder / name)]
            outcomes[name] = (result, time.perf_counter() - began)
            print(f"== {name} ({args.size}, cap {args.cap if limit else 'none'} a process): {time.perf_counter() - began:.0f} s")
            print(describe(result) if limit else "\n".join(line for line in describe(result).splitlines() if not line.startswith("cap:")))
            print(f"checkpoint folders: {saved or 'none'}; complete sharded checkpoints: {complete or 'none'}\n", flush=True)
    uncapped, capped, sharded = (outcomes[name][0] for name in runs)
    fits = uncapped.returncode == 0 and capped.out_of_memory and sharded.returncode == 0
    print(f"does not fit one process, fits two sharded: {'yes' if fits else 'NO'}")
    sys.exit(0 if fits else 1)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
