"""Sharded training's memory and step time: ours (``composer_fn.trainer.sharding``, the step a ``Trainer`` with
``parallelism=FSDP()`` runs) beside a hand-written ``fully_shard`` + ``torch.optim`` loop, at 1, 2 and 4 processes.

A Llama-style model (Hugging Face ``LlamaForCausalLM``; ``--size 300m`` is about 300M parameters, ``50m`` and
``10m`` are quicker), fp32, AdamW, each block a unit, gloo on the CPU (one thread a process). Every measurement
is its own set of processes, so each peak is that loop's alone: the processes build the model, shard it, take
``--steps`` steps after one warm-up step, and report

- the peak resident memory of each process (``ru_maxrss``) and, under it, the process's resident memory after
  importing torch and transformers (the baseline, the same for both loops);
- the training state each process holds, counted from its tensors: the parameters' shards, the gradients'
  shards (as many bytes: each is its parameter's shape), the optimizer's state, and the largest unit's whole
  parameters (what a gather holds at once);
- the median step time.

Goals (printed): the per-process training state falls as 1/N (within 15%), our peak is at most 1.1× the
``fully_shard`` loop's, and our step at 2 processes at most 1.10× its.

    .venv/bin/python benchmarks/sharded_memory.py [--size 300m] [--processes 1 2 4] [--steps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from _peer import environment, format_table, write_json

SIZES = {
    # hidden, layers, intermediate, heads, vocab
    "300m": (1024, 18, 2816, 16, 32000),
    "50m": (512, 8, 1408, 8, 16000),
    "10m": (256, 4, 704, 4, 8000),
}
BATCH, LENGTH = 2, 64


def _model(size: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, intermediate, heads, vocab = SIZES[size]
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=LENGTH, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _batch(step: int, rank: int, size: str) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, SIZES[size][4], (BATCH, LENGTH), generator=torch.Generator().manual_seed(1000 * step + rank))
    return {"input_ids": ids, "labels": ids}


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss() -> int:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _local_bytes(tensors: Any) -> int:
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def _worker(rank: int, world: int, port: int, loop: str, size: str, steps: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist
    import transformers  # noqa: F401  (imported before the baseline, as both loops need it)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from composer_fn.trainer.distributed import all_reduce_sum
    from composer_fn.trainer.sharding import FSDP, local_shards, make_sharded_step, shard_module, shard_units

    dist.init_process_group("gloo")
    baseline = _current_rss()
    model = _model(size)
    units = [unit for _, unit in shard_units(model, FSDP())]
    largest_unit = max(sum(p.numel() * p.element_size() for p in unit.parameters()) for unit in units)
    times = []
    if loop == "ours":
        from composer_fn.core.random import key
        from composer_fn.core.state import State
        from composer_fn.optim import adamw

        shard_module(model, FSDP(), init_device_mesh("cpu", (world,)))
        params = local_shards(model)
        tx = adamw(1e-4, weight_decay=0.0)
        state = State(params=params, buffers=dict(model.named_buffers()), opt=tx.init(params), algos={}, hparams={}, step=torch.zeros((), dtype=torch.int64), key=key(0))
        step = make_sharded_step(model, lambda outputs, batch: outputs.loss, tx, reduce=all_reduce_sum, processes=world, input_key=None)
        for index in range(steps + 1):
            began = time.perf_counter()
            state, _ = step(state, _batch(index, rank, size))
            if index:
                times.append(time.perf_counter() - began)
        optimizer_bytes = _local_bytes(t for t in torch.utils._pytree.tree_leaves(state.opt) if isinstance(t, torch.Tensor))
        param_bytes = _local_bytes(state.params.values())
    else:
        mesh = init_device_mesh("cpu", (world,))
        for unit in units:
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
        for index in range(steps + 1):
            began = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            model(**_batch(index, rank, size)).loss.backward()
            optimizer.step()
            if index:
                times.append(time.perf_counter() - began)
        optimizer_bytes = _local_bytes(t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
        param_bytes = _local_bytes(model.parameters())
    dist.barrier()
    torch.save(
        {
            "peak": _rss_bytes(),
            "baseline": baseline,
            "params": param_bytes,
            "grads": param_bytes,
            "optimizer": optimizer_bytes,
            "gathered": largest_unit,
            "step": statistics.median(times),
        },
        Path(out, f"{rank}.pt"),
    )
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def measure(loop: str, world: int, size: str, steps: int) -> dict[str, float]:
    """Returns rank 0's figures (and the largest peak over the ranks) of ``loop`` on ``world`` fresh processes."""
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(world, _free_port(), loop, size, steps, out), nprocs=world, start_method="spawn")
        ranks = [torch.load(Path(out, f"{rank}.pt")) for rank in range(world)]
    first = dict(ranks[0])
    first["peak"] = max(rank["peak"] for rank in ranks)
    first["state"] = first["params"] + first["grads"] + first["optimizer"]
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="300m", choices=tuple(SIZES), help="the model (default 300m)")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4], help="world sizes (default 1 2 4)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up (default 3)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    parameters = sum(p.numel() for p in _model(args.size).parameters())
    print(f"Llama-style {args.size}: {parameters / 1e6:.0f}M parameters, fp32, AdamW, batch {BATCH}x{LENGTH} a process")
    figures: dict[str, dict[int, dict[str, float]]] = {"ours": {}, "fully_shard": {}}
    for world in args.processes:
        for loop in ("fully_shard", "ours") if world % 2 else ("ours", "fully_shard"):
            figures[loop][world] = measure(loop, world, args.size, args.steps)
    mib = 2**20
    rows = []
    for world in args.processes:
        for loop in ("ours", "fully_shard"):
            f = figures[loop][world]
            rows.append([
                str(world), loop, f"{(f['peak'] - f['baseline']) / mib:,.0f}", f"{f['params'] / mib:,.0f}",
                f"{f['grads'] / mib:,.0f}", f"{f['optimizer'] / mib:,.0f}", f"{f['gathered'] / mib:,.0f}",
                f"{f['state'] / mib:,.0f}", f"{f['step']:.2f}",
            ])  # fmt: skip
    print(format_table(
        ["processes", "loop", "peak - baseline MiB", "params", "grads", "optimizer", "largest unit", "state", "step s"],
        rows,
    ))  # fmt: skip
    one = figures["ours"].get(min(args.processes))
    for world in args.processes:
        ours, theirs = figures["ours"][world], figures["fully_shard"][world]
        peak = (ours["peak"] - ours["baseline"]) / (theirs["peak"] - theirs["baseline"])
        line = f"{world} processes: our peak / fully_shard's = {peak:.3f} (goal <= 1.10)"
        if one is not None and world != min(args.processes):
            scale = ours["state"] * world / (one["state"] * min(args.processes))
            line += f"; state x N / state at {min(args.processes)} = {scale:.3f} (goal within 15% of 1)"
        print(line)
    if 2 in args.processes:
        ratio = figures["ours"][2]["step"] / figures["fully_shard"][2]["step"]
        print(f"step at 2 processes: ours / fully_shard = {ratio:.3f} (goal <= 1.10)")
    if args.json is not None:
        write_json(args.json, {"environment": environment(1), "size": args.size, "parameters": parameters, "figures": figures})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
