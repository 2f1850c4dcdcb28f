"""M1, engine dispatch: microseconds per ``run_event``, ``run_host_event`` and ``make_plan`` call.

What is measured (CPU, ``torch.set_num_threads(1)`` unless ``--threads``):

- ``run_event`` at BEFORE_LOSS on a real ``State``/``StepCtx`` (MLP(64, 10) parameters, a batch of 8) with
  0 algorithms; with 3 no-op algorithms (frozen ``Algorithm`` records defined here whose traced hook returns
  its inputs: pure dispatch); with the two real algorithms that hook BEFORE_LOSS (MixUp(alpha=0.2) and
  LabelSmoothing) plus one no-op, next to the same three hooks called by hand, so the engine's share is
  their difference; and at an event none of three real algorithms hooks (most events of a step).
- the slope per extra handler, a least-squares line through 0, 1, 8 and 32 no-op handlers.
- ``run_host_event`` at BATCH_START with 0 algorithms, 3 no-op host hooks, and the real MixUp (its host hook
  draws the Beta mixing weight).
- ``make_plan`` on the memoized path (the plan for this timestamp was built before) with 0 algorithms,
  the 3 real algorithms (MixUp, LabelSmoothing, ChannelsLast) and 3 no-ops.
- Peer, in the same run (a separate interpreter, alternating rounds with ours): Composer 0.32.1's
  ``Engine.run_event`` at BATCH_START and AFTER_LOSS with 0 algorithms and 0 callbacks (a ``State`` around
  a ``ComposerClassifier`` of the same MLP shape), and its slope with 1, 3, 8, 32 no-op algorithms.

Each figure is ``timeit`` over many calls (about 0.05 s per repeat, at most 200k calls), repeated in
``--rounds`` alternating rounds; the table shows the median and the best round. Targets (performance.md
§7.4 M1): at most 2 µs per event with 0 algorithms, at most 0.5 µs per extra handler.

    .venv/bin/python benchmarks/engine_overhead.py [--threads 1] [--rounds 7] [--json out.json] [--no-peer]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
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

from composer_fn.algorithms import ChannelsLast, LabelSmoothing, MixUp
from composer_fn.core import random as R
from composer_fn.core.algorithm import Algorithm, Hook, HostHook
from composer_fn.core.engine import make_plan, run_event, run_host_event
from composer_fn.core.event import Event
from composer_fn.core.state import BatchMeta, State, Static, StepCtx
from composer_fn.core.time import Timestamp
from composer_fn.models import MLP

TARGET_EVENT_US = 2.0
TARGET_SLOPE_US = 0.5
SLOPE_HANDLERS = (0, 1, 8, 32)
SECONDS_PER_REPEAT = 0.05
MAX_NUMBER = 200_000


@dataclass(frozen=True)
class NoOp(Algorithm):
    """An algorithm that hooks one event and changes nothing: its cost is the engine's dispatch alone."""

    index: int = 0
    event: Event = Event.BEFORE_LOSS

    @property
    def name(self) -> str:
        return f"noop_{self.index}"

    def traced_hooks(self, plan_key: Hashable = ()) -> Mapping[Event, Hook]:
        return {self.event: self._identity} if self.event.traced else {}

    def host_hooks(self) -> Mapping[Event, HostHook]:
        return {} if self.event.traced else {self.event: self._host_identity}

    def _identity(self, state: State, ctx: StepCtx) -> tuple[State, StepCtx]:
        return state, ctx

    def _host_identity(
        self, static: Static, state: State, timestamp: Timestamp, meta: BatchMeta | None
    ) -> tuple[Static, State]:
        return static, state


def noops(count: int, event: Event = Event.BEFORE_LOSS) -> tuple[NoOp, ...]:
    """Returns ``count`` distinct no-op algorithms hooking ``event``."""
    return tuple(NoOp(index, event) for index in range(count))


def fixture() -> dict[str, Any]:
    """Returns the records the cases run on: a real State and a StepCtx as it arrives at BEFORE_LOSS."""
    module = MLP(64, 10, hidden=(64,))
    static = Static(module=module)
    params = {name: p.detach().clone() for name, p in module.named_parameters()}
    state = State(
        params=params,
        buffers={},
        opt=None,
        algos={},
        hparams={},
        step=torch.zeros((), dtype=torch.int64),
        key=R.key(0),
    )
    real = (MixUp(alpha=0.2), LabelSmoothing(), ChannelsLast())
    state = state.replace(algos={a.name: a.init(static, state) for a in real})
    timestamp = Timestamp()
    plan = make_plan(real, timestamp=timestamp)
    static, state = run_host_event(Event.BATCH_START, plan, static, state, timestamp, BatchMeta(8))
    generator = torch.Generator().manual_seed(0)
    batch = (torch.randn(8, 64, generator=generator), torch.randint(0, 10, (8,), generator=generator))
    ctx = StepCtx(
        batch=batch, key=R.fold_in(state.key, state.step), loss_fn=lambda out, b: F.cross_entropy(out, b[1])
    )
    # MixUp's BEFORE_LOSS hook reads the permutation its BEFORE_FORWARD hook drew: run the step up to there.
    state, ctx = run_event(Event.BEFORE_FORWARD, plan, state, ctx)
    ctx = ctx.replace(outputs=torch.func.functional_call(module, params, (ctx.batch[0],)))
    return {"static": static, "state": state, "ctx": ctx, "timestamp": timestamp, "real": real}


@dataclass
class Case:
    """One timed statement: ``stmt`` runs ``number`` times per repeat against ``namespace``."""

    key: str
    label: str
    stmt: str
    namespace: dict[str, Any]
    number: int = 0
    seconds: list[float] | None = None

    def calibrate(self) -> None:
        timer = timeit.Timer(self.stmt, globals=self.namespace)
        calls, elapsed = 1, 0.0
        while elapsed < 0.01:
            calls *= 4
            elapsed = timer.timeit(calls)
        self.number = max(1_000, min(MAX_NUMBER, int(calls * SECONDS_PER_REPEAT / elapsed)))
        self.seconds = []

    def measure(self) -> None:
        assert self.seconds is not None
        elapsed = timeit.Timer(self.stmt, globals=self.namespace).timeit(self.number)
        self.seconds.append(elapsed / self.number)


def our_cases(data: dict[str, Any]) -> list[Case]:
    """Returns every case of our engine, each with the plan it runs against already built."""
    state, ctx, static, timestamp = data["state"], data["ctx"], data["static"], data["timestamp"]
    mixup, smoothing, channels_last = data["real"]
    base = {
        "run_event": run_event,
        "run_host_event": run_host_event,
        "make_plan": make_plan,
        "state": state,
        "ctx": ctx,
        "static": static,
        "timestamp": timestamp,
        "meta": BatchMeta(8),
        "Event": Event,
        "BEFORE_LOSS": Event.BEFORE_LOSS,
        "BATCH_START": Event.BATCH_START,
        "AFTER_DATALOADER": Event.AFTER_DATALOADER,
    }

    def with_plan(algorithms: tuple[Algorithm, ...], **extra: Any) -> dict[str, Any]:
        return {**base, "plan": make_plan(algorithms, timestamp=timestamp), "algorithms": algorithms, **extra}

    mixed = (mixup, smoothing, NoOp(0))
    mixed_plan = make_plan(mixed, timestamp=timestamp)
    hooks = mixed_plan.hooks[Event.BEFORE_LOSS]
    assert [h.__self__.name for h in hooks] == ["mixup", "label_smoothing", "noop_0"], hooks  # type: ignore[attr-defined]
    by_hand = {**base, "h0": hooks[0], "h1": hooks[1], "h2": hooks[2]}

    cases = [
        Case(
            "event_0",
            "run_event BEFORE_LOSS, 0 algorithms",
            "run_event(BEFORE_LOSS, plan, state, ctx)",
            with_plan(()),
        ),
        Case(
            "event_real_3",
            "run_event BEFORE_LOSS, MixUp + LabelSmoothing + no-op",
            "run_event(BEFORE_LOSS, plan, state, ctx)",
            {**base, "plan": mixed_plan},
        ),
        Case(
            "hand_real_3",
            "  the same 3 hooks called by hand (no engine)",
            "h2(*h1(*h0(state, ctx)))",
            by_hand,
        ),
        Case(
            "event_unhooked",
            "run_event AFTER_DATALOADER, 3 real algorithms, none hooks it",
            "run_event(AFTER_DATALOADER, plan, state, ctx)",
            with_plan(data["real"]),
        ),
        Case(
            "host_0",
            "run_host_event BATCH_START, 0 algorithms",
            "run_host_event(BATCH_START, plan, static, state, timestamp, meta)",
            with_plan(()),
        ),
        Case(
            "host_noop_3",
            "run_host_event BATCH_START, 3 no-op host hooks",
            "run_host_event(BATCH_START, plan, static, state, timestamp, meta)",
            with_plan(noops(3, Event.BATCH_START)),
        ),
        Case(
            "host_mixup",
            "run_host_event BATCH_START, MixUp (host Beta draw)",
            "run_host_event(BATCH_START, plan, static, state, timestamp, meta)",
            with_plan((mixup,)),
        ),
        Case(
            "plan_0",
            "make_plan (memoized), 0 algorithms",
            "make_plan(algorithms, timestamp=timestamp)",
            with_plan(()),
        ),
        Case(
            "plan_real_3",
            "make_plan (memoized), MixUp + LabelSmoothing + ChannelsLast",
            "make_plan(algorithms, timestamp=timestamp)",
            with_plan(data["real"]),
        ),
        Case(
            "plan_noop_3",
            "make_plan (memoized), 3 no-ops",
            "make_plan(algorithms, timestamp=timestamp)",
            with_plan(noops(3)),
        ),
    ]
    slope_cases = [
        Case(
            f"event_noop_{count}",
            f"run_event BEFORE_LOSS, {count} no-op hook{'s' if count > 1 else ''}",
            "run_event(BEFORE_LOSS, plan, state, ctx)",
            with_plan(noops(count)),
        )
        for count in sorted({*SLOPE_HANDLERS[1:], 3})
    ]
    return cases[:1] + slope_cases + cases[1:]


PEER_SOURCE = r'''
import timeit
import torch

def setup():
    torch.set_num_threads(THREADS)
    global ENGINE, STATE, EVENTS, NOOPS
    import composer
    from composer.core import Algorithm, Engine, Event, State
    from composer.devices import DeviceCPU
    from composer.loggers import Logger
    from composer.models import ComposerClassifier

    class NoOp(Algorithm):
        """Hooks AFTER_LOSS and changes nothing."""
        def match(self, event, state):
            return event == Event.AFTER_LOSS
        def apply(self, event, state, logger):
            return None

    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    model = ComposerClassifier(net, num_classes=10)
    data = torch.utils.data.TensorDataset(torch.randn(256, 64), torch.randint(0, 10, (256,)))
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    STATE = State(
        model=model, rank_zero_seed=0, run_name="x", device=DeviceCPU(), max_duration="1ep",
        dataloader=loader, dataloader_label="train",
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1), algorithms=[], callbacks=[],
    )
    ENGINE = Engine(STATE, Logger(STATE, []))
    EVENTS = {"BATCH_START": Event.BATCH_START, "AFTER_LOSS": Event.AFTER_LOSS}
    NOOPS = [NoOp() for _ in range(32)]
    for event in EVENTS.values():  # the first call of an event pays for lazy imports and caches
        for _ in range(10):
            ENGINE.run_event(event)
    return {"composer": composer.__version__, "torch": torch.__version__}

def _timer(event, algorithms):
    STATE.algorithms = NOOPS[:algorithms]
    return timeit.Timer("run(event)", globals={"run": ENGINE.run_event, "event": EVENTS[event]})

def calibrate(event, algorithms, seconds):
    timer = _timer(event, algorithms)
    calls, elapsed = 1, 0.0
    while elapsed < 0.01:
        calls *= 4
        elapsed = timer.timeit(calls)
    return max(200, int(calls * seconds / elapsed))

def measure(event, algorithms, number):
    return _timer(event, algorithms).timeit(number) / number
'''

PEER_CASES = (
    ("peer_batch_start_0", "Composer run_event BATCH_START, 0 algorithms", "BATCH_START", 0),
    ("peer_after_loss_0", "Composer run_event AFTER_LOSS, 0 algorithms", "AFTER_LOSS", 0),
    ("peer_after_loss_1", "Composer run_event AFTER_LOSS, 1 no-op algorithm", "AFTER_LOSS", 1),
    ("peer_after_loss_3", "Composer run_event AFTER_LOSS, 3 no-op algorithms", "AFTER_LOSS", 3),
    ("peer_after_loss_8", "Composer run_event AFTER_LOSS, 8 no-op algorithms", "AFTER_LOSS", 8),
    ("peer_after_loss_32", "Composer run_event AFTER_LOSS, 32 no-op algorithms", "AFTER_LOSS", 32),
)


def slope(points: list[tuple[int, float]]) -> float:
    """Returns the least-squares slope of ``(handlers, µs)`` points."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Returns every result after printing the table."""
    pin_threads(args.threads)
    peer: Peer | None = None
    peer_note = ""
    python = None if args.no_peer else find_peer_python(args.peer_python)
    if args.no_peer:
        peer_note = "peer column skipped (--no-peer)"
    elif python is None:
        peer_note = f"peer column skipped: no peer environment found (build it with bash {PEER_ENV_SCRIPT})"
    else:
        peer = Peer(python, PEER_SOURCE, threads=args.threads).start()

    cases = our_cases(fixture())
    for case in cases:
        case.calibrate()

    peer_numbers: dict[str, int] = {}
    peer_seconds: dict[str, list[float]] = {key: [] for key, *_ in PEER_CASES}
    peer_info: Any = None
    if peer is not None:
        try:
            peer_info = peer.wait_ready()
            for key, _, event, count in PEER_CASES:
                peer_numbers[key] = peer.call(
                    "calibrate", event=event, algorithms=count, seconds=SECONDS_PER_REPEAT
                )
        except PeerError as error:
            peer_note = f"peer column skipped: {error}"
            peer.close()
            peer = None

    for round_index in range(args.rounds):
        if sys.stderr.isatty():
            print(f"round {round_index + 1}/{args.rounds}", end="\r", file=sys.stderr, flush=True)
        for case in cases:
            case.measure()
        if peer is not None:
            try:
                for key, _, event, count in PEER_CASES:
                    peer_seconds[key].append(
                        peer.call("measure", event=event, algorithms=count, number=peer_numbers[key])
                    )
            except PeerError as error:
                peer_note = f"peer column skipped: {error}"
                peer.close()
                peer = None
    if peer is not None:
        peer.close()

    results: dict[str, dict[str, Any]] = {}
    for case in cases:
        assert case.seconds is not None
        stats = {k: v * 1e6 if k != "n" else v for k, v in summary(case.seconds).items()}
        results[case.key] = {"label": case.label, "calls_per_repeat": case.number, "us": stats}
    for key, label, _, _ in PEER_CASES:
        if peer_seconds[key] and len(peer_seconds[key]) == args.rounds:
            stats = {k: v * 1e6 if k != "n" else v for k, v in summary(peer_seconds[key]).items()}
            results[key] = {"label": label, "calls_per_repeat": peer_numbers[key], "us": stats}

    median = {key: value["us"]["median"] for key, value in results.items()}
    ours_slope = slope([(n, median[f"event_noop_{n}" if n else "event_0"]) for n in SLOPE_HANDLERS])
    derived = {
        "slope_us_per_handler": ours_slope,
        "engine_share_real_3_us": median["event_real_3"] - median["hand_real_3"],
        # What the eager Trainer spends in the engine per step with no algorithms: 10 traced events and 2
        # plans (its host events are skipped when the plan has no host hooks for them).
        "trainer_step_dispatch_0_us": 10 * median["event_0"] + 2 * median["plan_0"],
    }
    peer_slope = None
    if "peer_after_loss_32" in results:
        peer_slope = slope([(n, median[f"peer_after_loss_{n}"]) for n in (0, 1, 3, 8, 32)])
        derived["peer_slope_us_per_handler"] = peer_slope
        # A Composer training batch fires 13 events (performance.md §3.3).
        derived["peer_step_dispatch_0_us"] = (
            13 * (median["peer_batch_start_0"] + median["peer_after_loss_0"]) / 2
        )

    print_report(results, derived, peer_note, peer_info, args)
    return {"results": results, "derived": derived, "peer": peer_info, "peer_note": peer_note}


def print_report(
    results: dict[str, dict[str, Any]],
    derived: dict[str, float],
    peer_note: str,
    peer_info: Any,
    args: argparse.Namespace,
) -> None:
    """Prints the table, the derived figures and the targets."""
    rows = []
    for value in results.values():
        us = value["us"]
        rows.append(
            (
                value["label"],
                f"{us['median']:.3f}",
                f"{us['min']:.3f}",
                f"{us['iqr']:.3f}",
                f"{value['calls_per_repeat']:,}",
            )
        )
    print(
        f"Engine dispatch, µs per call (torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds)"
    )
    print(format_table(("case", "median µs", "best µs", "IQR µs", "calls/round"), rows))
    print()
    zero = results["event_0"]["us"]["median"]
    verdict = "meets" if zero <= TARGET_EVENT_US else "MISSES"
    print(f"run_event, 0 algorithms: {zero:.3f} µs  (target ≤ {TARGET_EVENT_US} µs: {verdict})")
    slope_us = derived["slope_us_per_handler"]
    verdict = "meets" if slope_us <= TARGET_SLOPE_US else "MISSES"
    print(
        f"slope per extra no-op handler (0/1/8/32): {slope_us:.3f} µs  (target ≤ {TARGET_SLOPE_US} µs: {verdict})"
    )
    print(
        f"engine share of MixUp + LabelSmoothing + no-op at BEFORE_LOSS: {derived['engine_share_real_3_us']:.3f} µs "
        f"of {results['event_real_3']['us']['median']:.1f} µs"
    )
    print(
        "eager Trainer engine cost per step, 0 algorithms (10 run_event + 2 make_plan, derived): "
        f"{derived['trainer_step_dispatch_0_us']:.2f} µs"
    )
    if "peer_after_loss_0" in results:
        ours, theirs = results["event_0"]["us"]["median"], results["peer_after_loss_0"]["us"]["median"]
        print()
        print(
            f"peer: Composer {peer_info['composer']} (torch {peer_info['torch']}), same run, alternating rounds"
        )
        start = results["peer_batch_start_0"]["us"]["median"]
        print(
            f"Composer run_event / ours, 0 algorithms: AFTER_LOSS {theirs / ours:.0f}×, BATCH_START {start / ours:.0f}× "
            f"(ours at BEFORE_LOSS; ours at BATCH_START is a host event: "
            f"{start / results['host_0']['us']['median']:.0f}× run_host_event)"
        )
        print(
            f"Composer slope per extra no-op algorithm: {derived['peer_slope_us_per_handler']:.3f} µs "
            f"({derived['peer_slope_us_per_handler'] / slope_us:.0f}× ours)"
        )
        print(
            f"Composer dispatch per training batch, 13 events × 0 algorithms (derived): "
            f"{derived['peer_step_dispatch_0_us']:.0f} µs"
        )
    if peer_note:
        print(peer_note)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--rounds", type=int, default=7, help="alternating measurement rounds (default 7)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be >= 1")
    report = run(args)
    if args.json is not None:
        write_json(
            args.json, {"benchmark": "engine_overhead", "environment": environment(args.threads), **report}
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
