"""Every method under sharding: each trained sharded on two processes against one process on the same global batches.

For each method (its defaults) and each model, one process trains with the method on global batches of 4, cut into
microbatches of 2 (what each of two processes holds); then two gloo processes train the same run sharded with
``FSDP()``, each on its half of every batch. The cell says whether the sharded run ends at the one-process run's
parameters (within fp32 reduction-order noise), or was refused before its first step, and why.

    python benchmarks/sharded_methods.py --json fsdp.json --markdown fsdp.md

Outcomes: ``same`` (every parameter and floating buffer within rtol 1e-4, atol 1e-5 of the one-process run's);
``inapplicable`` where both runs refused the method before their first step (it does not apply to the
model's batches); ``rounding`` where they are further apart, but the one-process run moves at least a tenth as far from itself when
its initial weights are moved by 1e-7 of their size, as fp32 rounding moves them (a run that amplifies rounding:
SAM on BatchNorm over two samples); ``refused`` (a ValueError from composer_fn before the first step, in both runs or in the sharded one), ``DIFFERS``
(with the largest difference) and ``ERROR`` (anything else); the script exits 1 on either of the last two.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

import composer_fn.algorithms  # noqa: F401  (registers every method)
from composer_fn import optim
from composer_fn.core.algorithm import REGISTRY
from composer_fn.testing.models import language_model, token_batches, vision_model
from composer_fn.trainer import FSDP, Trainer

STOPPERS = {"early_stopper", "threshold_stopper"}
METHODS = sorted(set(REGISTRY) - STOPPERS)
MODELS = ("torchvision/resnet18", "hf/gpt2")
MORE_CELLS = (
    ("torchvision/resnet50", "stochastic_depth"),
    ("torchvision/resnet50", "stochastic_depth[stochastic_method=sample]"),
    ("hf/bert-classification", "gated_linear_units"),
)
"""Methods that act on neither model at their defaults, on a model they act on (as the methods' matrix shows); a
method's name may be followed by settings, ``name[field=value]``."""
PROCESSES = 2
GLOBAL_BATCH = 4
STEPS = 2


def _batches(row: str) -> list[Any]:
    if row.startswith("hf/"):
        kind = {"hf/gpt2": "causal", "hf/llama": "causal", "hf/bert-mlm": "masked"}.get(row, "classification")
        return token_batches(STEPS, batch_size=GLOBAL_BATCH, length=16, kind=kind)
    generator = torch.Generator().manual_seed(0)
    size = 32 if "vit" in row else 64
    images = torch.rand(STEPS, GLOBAL_BATCH, 3, size, size, generator=generator)
    labels = torch.randint(0, 10, (STEPS, GLOBAL_BATCH), generator=generator)
    return [(images[i], labels[i]) for i in range(STEPS)]


def _share(batch: Any, rank: int) -> Any:
    rows = GLOBAL_BATCH // PROCESSES
    if isinstance(batch, dict):
        return {name: item[rank * rows : (rank + 1) * rows] for name, item in batch.items()}
    return tuple(item[rank * rows : (rank + 1) * rows] for item in batch)


def _model(row: str) -> torch.nn.Module:
    return language_model(row[3:]) if row.startswith("hf/") else vision_model(row)  # type: ignore[no-any-return]


def _algorithm(method: str) -> Any:
    name, _, settings = method.rstrip("]").partition("[")
    return REGISTRY[name](**dict(setting.split("=") for setting in settings.split(",") if setting))


def _noised(model: torch.nn.Module, noise: float) -> torch.nn.Module:
    # Each weight moved by a relative ``noise`` (fp32's rounding is 6e-8): how far rounding alone carries the run.
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1 + noise * torch.randn(parameter.shape, generator=generator))
    return model


def _run(row: str, method: str, rank: int | None, noise: float = 0.0) -> dict[str, Any]:
    """Trains ``row`` with ``method``: in one process (``rank`` None) with microbatches, its weights first moved by a
    relative ``noise``, else sharded as ``rank``."""
    batches = _batches(row) if rank is None else [_share(batch, rank) for batch in _batches(row)]
    sharding = {"device_train_microbatch_size": GLOBAL_BATCH // PROCESSES} if rank is None else {"parallelism": FSDP()}
    trainer = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer = Trainer(
                _noised(_model(row), noise), batches, max_duration="2ep", algorithms=[_algorithm(method)], seed=0,
                optimizer=optim.sgd(learning_rate=0.01, momentum=0.9), progress_bar=False, **sharding,
            )  # fmt: skip
            trainer.fit()
            model = trainer.model
        except Exception as error:  # noqa: BLE001 (anything but a refusal before the first step is a defect)
            where = traceback.extract_tb(error.__traceback__)
            ours = isinstance(error, ValueError) and bool(where) and "composer_fn" in where[-1].filename
            first = trainer is None or trainer.timestamp.batch == 0
            said = f"{type(error).__name__}: {error}".splitlines()[0]
            return {"outcome": "refused" if ours and first else "ERROR", "message": said}
    tensors = {f"param {n}": p.detach().clone() for n, p in model.named_parameters()}
    tensors.update({f"buffer {n}": b.detach().clone() for n, b in model.named_buffers() if b.is_floating_point()})
    return {"outcome": "trained", "tensors": tensors}


def _difference(one: dict[str, Any], other: dict[str, Any]) -> tuple[float, str]:
    # The largest excess over rtol 1e-4 of ``other``'s tensors against ``one``'s, and where.
    worst, where = 0.0, ""
    for name, expected in one["tensors"].items():
        got = other["tensors"][name]
        excess = ((got - expected).abs() - 1e-4 * expected.abs()).max().item() if got.numel() else 0.0
        if excess > worst:
            worst, where = excess, name
    return worst, where


def _compare(one: dict[str, Any], sharded: dict[str, Any], noised: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Returns the cell of a method: ``sharded``'s outcome against ``one``'s; where they differ, whether the
    one-process run differs as much from itself with its initial weights moved by fp32 rounding (``noised``)."""
    if sharded["outcome"] == "refused" and one["outcome"] == "refused":
        return {"outcome": "inapplicable", "message": sharded["message"]}
    if sharded["outcome"] != "trained":
        return {k: v for k, v in sharded.items() if k != "tensors"}
    if one["outcome"] != "trained":
        return {"outcome": "ERROR", "message": f"one process: {one['message']}; sharded: trained"}
    if one["tensors"].keys() != sharded["tensors"].keys():
        return {"outcome": "DIFFERS", "message": "the models' tensors differ in name"}
    for name, expected in one["tensors"].items():
        got = sharded["tensors"][name]
        if got.shape != expected.shape:
            return {"outcome": "DIFFERS", "message": f"{name}: shape {tuple(got.shape)} against {tuple(expected.shape)}"}
    worst, where = _difference(one, sharded)
    if worst <= 1e-5:
        return {"outcome": "same", "message": f"within {max(worst, 0.0):.1e}"}
    itself, _ = _difference(one, noised())
    said = f"{where}: off by {worst:.2e} beyond rtol 1e-4; the one-process run moves by {itself:.2e} from itself"
    return {"outcome": "rounding" if itself >= worst / 10 else "DIFFERS", "message": said + " when rounding moves its weights"}


def _worker(rank: int, port: int, cells: list[tuple[str, str]], folder: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(PROCESSES), LOCAL_WORLD_SIZE=str(PROCESSES))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    results = {}
    for row, method in cells:
        if rank == 0:
            print(f"sharded: {row} {method}", file=sys.stderr, flush=True)
        results[f"{row}|{method}"] = _run(row, method, rank)
        torch.distributed.barrier()
    torch.save(results if rank == 0 else {}, Path(folder, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def render(results: dict[str, dict[str, Any]], models: list[str]) -> str:
    """Returns the markdown column of ``results``: one row per method, one cell per model."""
    marks = {"same": "✓", "rounding": "✓~", "inapplicable": "–", "refused": "R", "DIFFERS": "**DIFFERS**", "ERROR": "**ERROR**"}
    lines = ["| method | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
    for method in sorted({key.split("|")[1] for key in results if key.split("|")[0] in models}):
        cells = [marks[results[f"{row}|{method}"]["outcome"]] for row in models]
        more = [
            f"{marks[results[f'{row}|{m}']['outcome']]} ({row}{m[len(method):]})"
            for row, m in MORE_CELLS
            if m.partition("[")[0] == method and f"{row}|{m}" in results
        ]
        lines.append(f"| `{method}` | " + " | ".join(cells) + "".join(f"; {cell}" for cell in more) + " |")
    reasons = sorted(
        {(key.replace("|", ", "), r["message"]) for key, r in results.items() if r["outcome"] not in ("same", "inapplicable")}
    )
    lines.append("")
    lines.extend(f"- {cell}: {message}" for cell, message in reasons)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    models, methods = args.models.split(","), args.methods.split(",")
    cells = [(row, method) for row in models for method in methods]
    defaults = args.models == parser.get_default("models")
    cells += [(row, method) for row, method in MORE_CELLS if method.partition("[")[0] in methods and defaults]
    started = time.perf_counter()
    one = {f"{row}|{method}": _run(row, method, None) for row, method in cells}
    print(f"one process: {len(cells)} runs in {time.perf_counter() - started:.0f} s", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(_worker, args=(_port(), cells, folder), nprocs=PROCESSES, start_method="spawn")
        sharded = torch.load(Path(folder, "rank0.pt"), weights_only=False)
    print(f"both: {time.perf_counter() - started:.0f} s", flush=True)
    results = {
        f"{row}|{method}": _compare(one[f"{row}|{method}"], sharded[f"{row}|{method}"], functools.partial(_run, row, method, None, 1e-7))
        for row, method in cells
    }
    for key, result in results.items():
        print(f"{key:50s} {result['outcome']:8s} {result.get('message', '')}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    if args.markdown is not None:
        args.markdown.write_text(render(results, models))
    sys.exit(1 if any(r["outcome"] in ("DIFFERS", "ERROR") for r in results.values()) else 0)


if __name__ == "__main__":
    main()
