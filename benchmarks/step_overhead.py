"""M2, step overhead: time per training step of ``composer_fn.Trainer`` against a hand-written PyTorch loop.

Both loops do the same work: the same model with the same initial parameters, the same batches in the same
order (``composer_fn.data.TensorLoader``, seed 0, ``set_epoch`` each epoch), cross-entropy, and SGD with
momentum 0.9 (``composer_fn.optim.sgd`` against ``torch.optim.SGD(..., foreach=True)``); fp32, eager, no
loggers, no evaluation, no progress bar. Before timing, one epoch of each is run and their parameters are
compared.

Cases:
- tiny MLP: ``MLP(64, 10, hidden=(64,))`` on 4096 synthetic 64-feature samples, batch 32 (128 steps/epoch);
  here the framework's overhead dominates.
- digits CNN: ``SmallCNN(1, 10)`` on ``load_digits_task().train`` (1437 images 8×8), batch 128, last partial
  batch dropped (11 steps/epoch) so every step has one shape and the compiled step compiles once.

Eager figures are marginal (performance.md §7.2): ``(t(k2 epochs) − t(k1 epochs)) / steps between them``, with
a fresh Trainer (or model and optimizer) per run and its construction outside the timing, so start-up cancels.
Rounds alternate the loops (ours, hand, peers, in a rotating order); the table shows the median of the rounds,
the best round and the interquartile range.

Compiled (digits CNN): a Trainer with ``compile=True`` (inductor, the whole step in one graph) next to a
hand-written loop over ``torch.compile(model)`` (forward and backward compiled, optimizer step eager). Both
are compiled before timing: the Trainer by calling its step function once (it is pure, so the state is
unchanged, and the Trainer caches the compiled step), the hand loop by one epoch. Then one ``fit()`` runs
``--compiled-epochs`` epochs; a callback at EPOCH_END runs one epoch of the hand-compiled loop in the gap, so
the two alternate epoch by epoch. Per-step time is the median epoch time divided by the steps per epoch; the
Trainer's epoch time runs from leaving one EPOCH_END to reaching the next, so it holds all of its per-epoch
work. Compile time is reported separately.

Peers, in the same run (their own interpreter, rounds alternating with ours), tiny MLP only: Composer 0.32.1
``Trainer.fit`` (``progress_bar=False, log_to_console=False, loggers=[]``) with its default training metric
(``ComposerClassifier`` computes MulticlassAccuracy every batch) and without it; PyTorch Lightning
``Trainer.fit`` configured as in its parity test (no logger, checkpointing, progress bar or model summary);
and the hand-written loop again in the peer interpreter, as that column's own baseline. The peers read the same
tensors and initial parameters through a ``DataLoader(batch_size=None)`` over a dataset that gathers each batch
with ``index_select`` as ``TensorLoader`` does; they repeat epoch 0's order every epoch.

To show where the eager Trainer's extra time goes (tiny MLP): its own step function driven by a bare loop
(a marginal row; ``fit()`` minus it is the Trainer's loop, it minus the hand loop is the functional step), and a
table of the step's pieces, each timed alone next to the torch code doing the same work. Pieces timed alone do
not add up to a whole step (a longer sequence of small ops runs slower per op on this CPU, for both loops), so
read their differences, not their sum. ``--profile STEPS`` prints a cProfile of ``fit()`` instead.

Target (printed): eager Trainer ≤ 1.10× the hand-written loop.

    .venv/bin/python benchmarks/step_overhead.py [--threads 1] [--rounds 5] [--json out.json] [--no-peer]
        [--no-compile] [--profile STEPS]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _peer import (
    PEER_ENV_SCRIPT,
    Peer,
    PeerError,
    add_common_arguments,
    environment,
    find_peer_python,
    format_table,
    pin_threads,
    summary,
    write_json,
)
from torch import nn
from torch.func import functional_call

from composer_fn import Trainer
from composer_fn.callbacks.base import Callback, RunView
from composer_fn.core import random as R
from composer_fn.data import TensorLoader, load_digits_task
from composer_fn.models import MLP, SmallCNN
from composer_fn.optim import apply_updates, sgd

LEARNING_RATE = 0.05
MOMENTUM = 0.9
TARGET_RATIO = 1.10


@dataclass(frozen=True)
class Task:
    """A model, its data and how many epochs the two marginal runs take."""

    name: str
    build: Callable[[], nn.Module]
    tensors: tuple[torch.Tensor, torch.Tensor]
    batch_size: int
    drop_last: bool
    short: int
    long: int

    def loader(self) -> TensorLoader:
        """Returns a fresh loader: the same batches in the same order for every loop."""
        return TensorLoader(self.tensors, self.batch_size, seed=0, drop_last=self.drop_last)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.loader())

    @property
    def marginal_steps(self) -> int:
        return (self.long - self.short) * self.steps_per_epoch


def mlp_task() -> Task:
    """Returns the tiny-MLP task: synthetic inputs, where the framework's overhead dominates."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(4096, 64, generator=generator)
    targets = torch.randint(0, 10, (4096,), generator=generator)
    return Task("tiny MLP", lambda: MLP(64, 10, hidden=(64,)), (inputs, targets), 32, False, 1, 4)


def cnn_task() -> Task:
    """Returns the digits-CNN task: the embedded digits, batch 128, the partial batch dropped."""
    return Task("digits CNN", lambda: SmallCNN(1, 10), load_digits_task().train, 128, True, 1, 16)


# -- our loops -----------------------------------------------------------------------------------------------


def make_trainer(task: Task, epochs: int, **options: Any) -> Trainer:
    """Returns a Trainer set up for ``epochs`` epochs of ``task`` (not yet fitted)."""
    return Trainer(
        task.build(),
        task.loader(),
        max_duration=f"{epochs}ep",
        optimizer=sgd(LEARNING_RATE, momentum=MOMENTUM),
        progress_bar=False,
        device="cpu",
        **options,
    )


def time_trainer(task: Task, epochs: int) -> float:
    """Returns the seconds ``fit()`` takes for ``epochs`` epochs (construction is not timed)."""
    trainer = make_trainer(task, epochs)
    start = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - start


def hand_epoch(
    model: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer, batches: Iterable[Any]
) -> None:
    """Runs one epoch of the hand-written loop."""
    for inputs, targets in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()


def hand_setup(task: Task) -> tuple[nn.Module, torch.optim.Optimizer, TensorLoader]:
    """Returns a fresh model (same initial parameters as the Trainer's), its optimizer and a fresh loader."""
    model = task.build().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM, foreach=True)
    return model, optimizer, task.loader()


def time_hand(task: Task, epochs: int) -> float:
    """Returns the seconds ``epochs`` epochs of the hand-written loop take (setup is not timed)."""
    model, optimizer, loader = hand_setup(task)
    start = time.perf_counter()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        hand_epoch(model, optimizer, loader)
    return time.perf_counter() - start


def time_bare_step(task: Task, epochs: int) -> float:
    """Returns the seconds ``epochs`` epochs take when the Trainer's own step function is driven by a bare loop.

    Its difference to ``fit()`` is the Trainer's loop (plans, host events, timestamps, logging); its difference
    to the hand loop is the functional step (gradient over ``functional_call``, optimizer, schedule).
    """
    trainer = make_trainer(task, epochs)
    step = trainer._train_step(trainer._plan(trainer.timestamp))
    state = trainer.state
    loader = task.loader()
    start = time.perf_counter()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            state, _ = step(state, batch)
    return time.perf_counter() - start


def check_same_work(task: Task) -> dict[str, float]:
    """Returns the largest differences between the Trainer's and the hand loop's tensors after one epoch."""
    trainer = make_trainer(task, 1)
    trainer.fit()
    model, optimizer, loader = hand_setup(task)
    loader.set_epoch(0)
    hand_epoch(model, optimizer, loader)
    hand_params = dict(model.named_parameters())
    hand_buffers = dict(model.named_buffers())
    param_diff = max((trainer.state.params[n] - p).abs().max().item() for n, p in hand_params.items())
    buffer_diff = max(
        [
            (trainer.state.buffers[n].double() - b.double()).abs().max().item()
            for n, b in hand_buffers.items()
        ],
        default=0.0,
    )
    scale = max(p.abs().max().item() for p in hand_params.values())
    return {"max_param_diff": param_diff, "max_buffer_diff": buffer_diff, "max_param": scale}


# -- peers ---------------------------------------------------------------------------------------------------

PEER_SOURCE = r'''
import time
import torch
import torch.nn.functional as F

def setup():
    torch.set_num_threads(THREADS)
    global Trainer, ComposerClassifier, MetricCollection, pl
    import composer
    import pytorch_lightning as pl
    from composer import Trainer
    from composer.models import ComposerClassifier
    from torchmetrics import MetricCollection
    return {"composer": composer.__version__, "lightning": pl.__version__, "torch": torch.__version__}

def prepare(path):
    global DATA
    DATA = torch.load(path, weights_only=True)
    return len(DATA["order"]) // DATA["batch_size"]

class Batches(torch.utils.data.Dataset):
    """Gathers batch i of a fixed order with index_select, as TensorLoader does."""
    def __len__(self):
        return len(DATA["order"]) // DATA["batch_size"]
    def __getitem__(self, index):
        size = DATA["batch_size"]
        rows = DATA["order"][index * size:(index + 1) * size]
        return DATA["inputs"].index_select(0, rows), DATA["targets"].index_select(0, rows)

def _loader():
    return torch.utils.data.DataLoader(Batches(), batch_size=None)

def _net():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    net.load_state_dict(DATA["init"])
    return net

def _sgd(parameters):
    return torch.optim.SGD(parameters, lr=DATA["lr"], momentum=DATA["momentum"], foreach=True)

def _composer(epochs, train_metrics):
    extra = {} if train_metrics else {"train_metrics": MetricCollection([])}
    model = ComposerClassifier(_net(), num_classes=10, **extra)
    return Trainer(
        model=model, train_dataloader=_loader(), max_duration=f"{epochs}ep", optimizers=_sgd(model.parameters()),
        device="cpu", progress_bar=False, log_to_console=False, loggers=[], seed=0,
        device_train_microbatch_size=DATA["batch_size"],
    ), model.module

def composer_fit(epochs, train_metrics):
    trainer, _ = _composer(epochs, train_metrics)
    start = time.perf_counter()
    trainer.fit()
    elapsed = time.perf_counter() - start
    trainer.close()
    return elapsed

def _lightning(epochs):
    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _net()
        def training_step(self, batch, batch_index):
            inputs, targets = batch
            return F.cross_entropy(self.net(inputs), targets)
        def configure_optimizers(self):
            return _sgd(self.parameters())
    trainer = pl.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, benchmark=False,
    )
    return trainer, Module()

def lightning_fit(epochs):
    trainer, module = _lightning(epochs)
    start = time.perf_counter()
    trainer.fit(module, _loader())
    return time.perf_counter() - start

def _hand(net, optimizer, epochs):
    loader = _loader()
    for _ in range(epochs):
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(inputs), targets)
            loss.backward()
            optimizer.step()

def hand_fit(epochs):
    net = _net()
    optimizer = _sgd(net.parameters())
    start = time.perf_counter()
    _hand(net, optimizer, epochs)
    return time.perf_counter() - start

def one_epoch_params(path):
    """Saves each loop's parameters after one epoch, for the check against ours."""
    trainer, net = _composer(1, True)
    trainer.fit()
    trainer.close()
    result = {"composer": {k: v.detach().clone() for k, v in net.state_dict().items()}}
    trainer, module = _lightning(1)
    trainer.fit(module, _loader())
    result["lightning"] = {k: v.detach().clone() for k, v in module.net.state_dict().items()}
    net = _net()
    _hand(net, _sgd(net.parameters()), 1)
    result["hand"] = {k: v.detach().clone() for k, v in net.state_dict().items()}
    torch.save(result, path)
    return sorted(result)
'''

PEER_LOOPS = (
    (
        "composer",
        "Composer 0.32.1 Trainer.fit, default train metric",
        "composer_fit",
        {"train_metrics": True},
    ),
    (
        "composer_no_metric",
        "Composer 0.32.1 Trainer.fit, train metric off",
        "composer_fit",
        {"train_metrics": False},
    ),
    ("lightning", "Lightning Trainer.fit", "lightning_fit", {}),
    ("peer_hand", "hand-written loop, peer interpreter", "hand_fit", {}),
)


def start_peer(args: argparse.Namespace) -> tuple[Peer | None, str]:
    """Returns the started peer (None when skipped) and a note on why it was skipped."""
    if args.no_peer:
        return None, "peer columns skipped (--no-peer)"
    python = find_peer_python(args.peer_python)
    if python is None:
        return None, f"peer columns skipped: no peer environment found (build it with bash {PEER_ENV_SCRIPT})"
    return Peer(python, PEER_SOURCE, threads=args.threads, timeout=180).start(), ""


def prepare_peer(peer: Peer, task: Task, folder: Path) -> dict[str, Any]:
    """Returns the peer's versions and the check of its loops against our hand loop after one epoch."""
    info = peer.wait_ready()
    loader = task.loader()
    init = {name: p.detach().clone() for name, p in task.build().state_dict().items()}
    data = {
        "inputs": task.tensors[0],
        "targets": task.tensors[1],
        "order": loader.order(0),
        "batch_size": task.batch_size,
        "init": init,
        "lr": LEARNING_RATE,
        "momentum": MOMENTUM,
    }
    torch.save(data, folder / "data.pt")
    peer.call("prepare", path=str(folder / "data.pt"))
    peer.call("one_epoch_params", path=str(folder / "params.pt"))
    theirs = torch.load(folder / "params.pt", weights_only=True)
    model, optimizer, loader = hand_setup(task)
    loader.set_epoch(0)
    hand_epoch(model, optimizer, loader)
    ours = model.state_dict()
    check = {
        name: max((params[k] - ours[k]).abs().max().item() for k in ours) for name, params in theirs.items()
    }
    return {"versions": info, "max_param_diff_vs_our_hand": check}


# -- measurement ---------------------------------------------------------------------------------------------


def marginal_rounds(
    task: Task, rounds: int, loops: list[tuple[str, Callable[[int], float]]]
) -> dict[str, list[float]]:
    """Returns each loop's marginal µs/step per round; the loops' order rotates from round to round."""
    samples: dict[str, list[float]] = {key: [] for key, _ in loops}
    for round_index in range(rounds):
        if sys.stderr.isatty():
            print(f"{task.name}: round {round_index + 1}/{rounds}", end="\r", file=sys.stderr, flush=True)
        shift = round_index % len(loops)
        for key, run in loops[shift:] + loops[:shift]:
            short = run(task.short)
            long = run(task.long)
            samples[key].append((long - short) / task.marginal_steps * 1e6)
    return samples


class EpochGaps(Callback):
    """Records the Trainer's epoch times and runs one epoch of another loop in each EPOCH_END gap."""

    def __init__(self, between: Callable[[int], None]) -> None:
        self.between = between
        self.trainer_seconds: list[float] = []
        self.other_seconds: list[float] = []
        self._left: float | None = None

    def epoch_end(self, view: RunView) -> None:
        arrived = time.perf_counter()
        if self._left is not None:
            self.trainer_seconds.append(arrived - self._left)
        self.between(view.timestamp.epoch)
        finished = time.perf_counter()
        self.other_seconds.append(finished - arrived)
        self._left = time.perf_counter()


class CompiledCase:
    """The compiled Trainer and the hand-compiled loop: compiled on construction, timed by ``measure()``."""

    def __init__(self, task: Task, epochs: int) -> None:
        self.task = task
        model, self.optimizer, self.hand_loader = hand_setup(task)
        self.compiled_model = torch.compile(model)
        start = time.perf_counter()
        self.hand_loader.set_epoch(0)
        hand_epoch(self.compiled_model, self.optimizer, self.hand_loader)
        self.hand_compile = time.perf_counter() - start

        self.gaps = EpochGaps(self._hand_compiled_epoch)
        self.trainer = make_trainer(task, epochs + 1, compile=True, callbacks=[self.gaps])
        first = next(iter(self.trainer.train_dataloader))
        start = time.perf_counter()
        # The step is a pure function of (state, batch): calling it compiles and caches it and changes nothing.
        self.trainer._train_step(self.trainer._plan(self.trainer.timestamp))(self.trainer.state, first)
        self.trainer_compile = time.perf_counter() - start

    def _hand_compiled_epoch(self, epoch: int) -> None:
        self.hand_loader.set_epoch(epoch)
        hand_epoch(self.compiled_model, self.optimizer, self.hand_loader)

    def measure(self) -> dict[str, Any]:
        """Returns steady-state µs/step of both loops (epochs alternating) and the compile times."""
        self.trainer.fit()
        steps = self.task.steps_per_epoch
        trainer_us = [s / steps * 1e6 for s in self.gaps.trainer_seconds]
        hand_us = [s / steps * 1e6 for s in self.gaps.other_seconds[1:]]
        return {
            "trainer": trainer_us,
            "hand": hand_us,
            "trainer_compile_s": self.trainer_compile,
            "hand_compile_s": self.hand_compile,
            "graphs_compiled": self.trainer.compiles,
            "epochs_timed": len(trainer_us),
        }


def step_components(task: Task, rounds: int) -> list[dict[str, Any]]:
    """Returns µs per call of the pieces of one eager step, ours next to the torch code doing the same work.

    Everything runs on one batch at steady state (after a first update, so momentum buffers exist); each
    pair is timed alternately, ``rounds`` times, and the median is kept.
    """
    trainer = make_trainer(task, 1)
    step = trainer._train_step(trainer._plan(trainer.timestamp))
    batch = next(iter(task.loader()))
    inputs, targets = batch
    state, _ = step(trainer.state, batch)
    module = trainer.static.module
    model, optimizer, _ = hand_setup(task)

    def hand_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    hand_step()
    params = dict(state.params)
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    plain = sgd(LEARNING_RATE, momentum=MOMENTUM)
    _, plain_state = plain.update(grads, plain.init(params), params)

    def functional_gradient() -> Any:
        leaves = {name: p.detach().requires_grad_() for name, p in params.items()}
        outputs = functional_call(module, (leaves, {}), (inputs,))
        return torch.autograd.grad(F.cross_entropy(outputs, targets), tuple(leaves.values()))

    def module_gradient() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(inputs), targets).backward()

    def functional_forward() -> Any:
        with torch.no_grad():
            return functional_call(module, (params, dict(state.buffers)), (inputs,))

    def module_forward() -> Any:
        with torch.no_grad():
            return model(inputs)

    def trainer_update() -> Any:
        updates, _ = trainer.tx.update(grads, state.opt, params)
        return apply_updates(params, updates)

    def sgd_update() -> Any:
        updates, _ = plain.update(grads, plain_state, params)
        return apply_updates(params, updates)

    pairs: list[tuple[str, Callable[[], Any], str, Callable[[], Any] | None]] = [
        (
            "Trainer step function, one call",
            lambda: step(state, batch),
            "hand step: zero_grad, fwd, loss, bwd, SGD.step",
            hand_step,
        ),
        (
            "forward, no_grad: functional_call(module, params)",
            functional_forward,
            "module(x)",
            module_forward,
        ),
        (
            "forward + loss + autograd.grad (functional)",
            functional_gradient,
            "module(x), loss, .backward()",
            module_gradient,
        ),
        (
            "Trainer's tx.update + apply_updates",
            trainer_update,
            "torch.optim.SGD.step (foreach)",
            optimizer.step,
        ),
        ("  the same without scale_by_schedule", sgd_update, "", None),
        (
            "step key fold_in(key, step) (with traced hooks)",
            lambda: R.fold_in(state.key, state.step),
            "",
            None,
        ),
    ]
    timings: dict[str, list[float]] = {}
    numbers: dict[str, int] = {}
    for label, ours, _, theirs in pairs:
        for key, function in ((label, ours), (label + "/torch", theirs)):
            if function is not None:
                calls, elapsed = 1, 0.0
                while elapsed < 0.005:
                    calls *= 2
                    elapsed = timeit.timeit(function, number=calls)
                numbers[key] = max(20, int(calls * 0.02 / elapsed))
                timings[key] = []
    for _ in range(rounds):
        for label, ours, _, theirs in pairs:
            for key, function in ((label, ours), (label + "/torch", theirs)):
                if function is not None:
                    timings[key].append(timeit.timeit(function, number=numbers[key]) / numbers[key] * 1e6)
    return [
        {
            "ours": label,
            "ours_us": statistics.median(timings[label]),
            "torch": torch_label,
            "torch_us": statistics.median(timings[label + "/torch"]) if theirs is not None else None,
        }
        for label, _, torch_label, theirs in pairs
    ]


def profile_trainer(steps: int) -> None:
    """Prints where an eager Trainer spends its time over ``steps`` steps of the tiny MLP (cProfile)."""
    task = mlp_task()
    trainer = Trainer(
        task.build(),
        task.loader(),
        max_duration=f"{steps}ba",
        optimizer=sgd(LEARNING_RATE, momentum=MOMENTUM),
        progress_bar=False,
        device="cpu",
    )
    profiler = cProfile.Profile()
    profiler.enable()
    trainer.fit()
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(30)
    print(f"cProfile of Trainer.fit, tiny MLP, {steps} steps, sorted by own time:")
    print(stream.getvalue())


# -- report --------------------------------------------------------------------------------------------------

LABELS = {
    "hand": "hand-written eager PyTorch loop",
    "ours": "composer_fn Trainer, eager",
    "bare": "  its step function in a bare loop",
    **{key: label for key, label, _, _ in PEER_LOOPS},
}


def row(task: str, label: str, values: list[float], baseline: float | None) -> tuple[str, ...]:
    stats = summary(values)
    ratio = f"{stats['median'] / baseline:.2f}×" if baseline else ""
    extra = f"{stats['median'] - baseline:+.0f}" if baseline else ""
    return (task, label, f"{stats['median']:.0f}", f"{stats['min']:.0f}", f"{stats['iqr']:.0f}", ratio, extra)


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    """Prints the tables, the checks and the targets."""
    print(
        f"Training-step time, µs/step (torch {torch.__version__}, {args.threads} thread(s), CPU, fp32); "
        f"median of {args.rounds} alternating rounds"
    )
    header = ("case", "loop", "median", "best", "IQR", "× hand", "Δ µs")
    rows: list[tuple[str, ...]] = []
    for task in results["tasks"]:
        samples = task["samples"]
        hand = statistics.median(samples["hand"])
        name = f"{task['name']} ({task['steps_per_epoch']} st/ep)"
        rows.append(row(name, LABELS["hand"], samples["hand"], None))
        rows.append(row(name, LABELS["ours"], samples["ours"], hand))
        if "bare" in samples:
            rows.append(row(name, LABELS["bare"], samples["bare"], hand))
        if "peer_hand" in samples:
            peer_hand = statistics.median(samples["peer_hand"])
            rows.append(row(name, LABELS["peer_hand"], samples["peer_hand"], hand))
            for key, label, _, _ in PEER_LOOPS[:-1]:
                rows.append(row(name, label + " (× peer hand)", samples[key], peer_hand))
        compiled = task.get("compiled")
        if compiled:
            hand_compiled = statistics.median(compiled["hand"])
            rows.append(row(name, "hand-written loop, torch.compile(model)", compiled["hand"], hand))
            rows.append(row(name, "composer_fn Trainer, compile=True", compiled["trainer"], hand))
            trainer_compiled = statistics.median(compiled["trainer"])
            rows.append(
                (
                    name,
                    "  compiled Trainer / compiled hand loop",
                    "",
                    "",
                    "",
                    f"{trainer_compiled / hand_compiled:.2f}×",
                    f"{trainer_compiled - hand_compiled:+.0f}",
                )
            )
    print(format_table(header, rows, "<<>>>>>"))
    print()
    components = results.get("components")
    if components:
        print("Pieces of one eager step, tiny MLP, µs per call (steady state, median of alternating rounds)")
        component_rows = []
        for item in components:
            theirs = item["torch_us"]
            component_rows.append(
                (
                    item["ours"],
                    f"{item['ours_us']:.1f}",
                    item["torch"],
                    f"{theirs:.1f}" if theirs is not None else "",
                    f"{item['ours_us'] - theirs:+.1f}" if theirs is not None else "",
                )
            )
        print(format_table(("ours", "µs", "torch doing the same", "µs", "Δ µs"), component_rows, "<><>>"))
        print()
    for task in results["tasks"]:
        marginal = f"(t({task['long']} ep) − t({task['short']} ep)) / {task['marginal_steps']} steps"
        check = task["check"]
        print(
            f"{task['name']}: marginal = {marginal}; after one epoch, Trainer vs hand loop: "
            f"max |Δ param| = {check['max_param_diff']:.2e} (largest |param| {check['max_param']:.2f}), "
            f"max |Δ buffer| = {check['max_buffer_diff']:.2e}"
        )
        compiled = task.get("compiled")
        if compiled:
            print(
                f"{task['name']} compiled: Trainer compile {compiled['trainer_compile_s']:.1f} s "
                f"({compiled['graphs_compiled']} graph(s)), torch.compile(model) {compiled['hand_compile_s']:.1f} s "
                f"(first epoch){' (wall times, while the peer interpreter was starting)' if results.get('peer') else ''}; "
                f"steady state over {compiled['epochs_timed']} epochs each, alternating"
            )
        ratio = statistics.median(task["samples"]["ours"]) / statistics.median(task["samples"]["hand"])
        verdict = "meets" if ratio <= TARGET_RATIO else "MISSES"
        print(
            f"{task['name']}: eager Trainer / hand loop = {ratio:.3f}×  (target ≤ {TARGET_RATIO:.2f}×: {verdict})"
        )
    peer = results.get("peer")
    if peer:
        versions = peer["versions"]
        diffs = ", ".join(f"{k} {v:.1e}" for k, v in peer["max_param_diff_vs_our_hand"].items())
        print(
            f"peers: Composer {versions['composer']}, Lightning {versions['lightning']}, torch {versions['torch']}; "
            f"after one epoch, max |Δ param| vs our hand loop: {diffs}"
        )
    if results.get("peer_note"):
        print(results["peer_note"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Returns every result after printing the report."""
    pin_threads(args.threads)
    peer, peer_note = start_peer(args)
    tasks = [mlp_task(), cnn_task()]
    results: dict[str, Any] = {"tasks": []}
    try:
        # Compiling first lets the peer import its libraries meanwhile; nothing is timed until both are done.
        compiled_case = None if args.no_compile else CompiledCase(tasks[1], args.compiled_epochs)
        peer_info = None
        with tempfile.TemporaryDirectory(prefix="step-overhead-") as folder:
            if peer is not None:
                try:
                    peer_info = prepare_peer(peer, tasks[0], Path(folder))
                except PeerError as error:
                    peer.close()
                    peer, peer_note = None, f"peer columns skipped: {error}"
            for task in tasks:
                check = check_same_work(task)
                loops: list[tuple[str, Callable[[int], float]]] = [
                    ("ours", lambda epochs, task=task: time_trainer(task, epochs)),
                    ("hand", lambda epochs, task=task: time_hand(task, epochs)),
                ]
                loops.append(("bare", lambda epochs, task=task: time_bare_step(task, epochs)))
                if peer is not None and task is tasks[0]:
                    for key, _, function, options in PEER_LOOPS:
                        loops.append(
                            (key, lambda epochs, p=peer, f=function, o=options: p.call(f, epochs=epochs, **o))
                        )
                try:
                    samples = marginal_rounds(task, args.rounds, loops)
                except PeerError as error:
                    peer.close()  # type: ignore[union-attr]
                    peer, peer_note = None, f"peer columns skipped: {error}"
                    samples = marginal_rounds(task, args.rounds, loops[:2])
                entry: dict[str, Any] = {
                    "name": task.name,
                    "steps_per_epoch": task.steps_per_epoch,
                    "batch_size": task.batch_size,
                    "short": task.short,
                    "long": task.long,
                    "marginal_steps": task.marginal_steps,
                    "check": check,
                    "samples": samples,
                    "summary": {key: summary(values) for key, values in samples.items()},
                }
                if task is tasks[1] and compiled_case is not None:
                    entry["compiled"] = compiled_case.measure()
                results["tasks"].append(entry)
    finally:
        if peer is not None:
            peer.close()
    if sys.stderr.isatty():
        print(" " * 40, end="\r", file=sys.stderr)
    results["components"] = step_components(tasks[0], max(args.rounds, 7))
    results["peer"] = peer_info
    results["peer_note"] = peer_note
    report(results, args)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--rounds", type=int, default=5, help="alternating marginal rounds (default 5)")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled rows (saves about 45 s)")
    parser.add_argument(
        "--compiled-epochs", type=int, default=8, help="timed epochs of the compiled loops (default 8)"
    )
    parser.add_argument(
        "--profile", type=int, default=0, metavar="STEPS", help="only print a cProfile of STEPS Trainer steps"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.compiled_epochs < 2:
        parser.error("--rounds must be >= 1 and --compiled-epochs >= 2")
    if args.profile:
        pin_threads(args.threads)
        profile_trainer(args.profile)
        return 0
    results = run(args)
    if args.json is not None:
        write_json(
            args.json, {"benchmark": "step_overhead", "environment": environment(args.threads), **results}
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
