"""Which step a run trains with: ``StepSpec`` names everything that shapes a training step, and ``StepCache``
builds each distinct one once.

The trainer and the contract suite (``composer_fn.testing.contract``) decide "which step" by a ``StepSpec``
(``dry_run``, which knows only the plans, counts their ``Plan.step_key``, the part of the spec a plan decides); a
cache belongs to one run, whose loss, optimizer and batch layout (``StepBuilder``) are fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from composer_fn.core.engine import Plan
from composer_fn.core.state import LossFn, State, Static
from composer_fn.optim.base import GradientTransformation
from composer_fn.trainer import distributed
from composer_fn.trainer.microbatch import Cut, split_batch
from composer_fn.trainer.options import Execution
from composer_fn.trainer.sharding import sharded_module
from composer_fn.trainer.step import (
    GradMode,
    StepFn,
    compile_step,
    make_eval_step,
    make_train_step,
    unused_parameters,
)

__all__ = ["StepSpec", "StepBuilder", "StepCache"]


@dataclass(frozen=True)
class StepSpec:
    """Everything that shapes a training step besides the run's loss, optimizer and batch layout: two steps of
    one run with equal specs are the same function.

    ``static`` is the model's structure and the run's precision and device; ``step_key`` the plan's traced events
    and plan keys (``Plan.step_key``); ``frozen`` the parameters that get neither gradient nor update (layer
    freezing); ``microbatch_size`` the size of the pieces the step cuts its batch into (None: it does not cut it);
    ``first_sample`` this process's first sample's place in the global batch; ``processes`` how many processes sum
    their gradients; ``units_scale`` the weight unit of the default loss's labelled positions; ``donate`` whether
    an eager step may update the state's tensors in place; ``guard_failures`` whether a step that runs out of
    memory on one process tells the others; ``norms`` whether it reports the gradients' norms; ``reseed`` whether
    the model's own draws are reseeded per microbatch (eager; a compiled graph draws its seeds once); ``compile``
    the ``torch.compile`` backend or None; ``sharded`` whether the module is sharded over the processes
    (``composer_fn.trainer.sharding``: its step is torch's backward through ``fully_shard``'s hooks).

    Where the run computes its gradients by ``torch.func`` (``grad_mode='func'``), the parameters its loss never
    reaches are found when the step is built, on the batch at hand (``StepCache.train_step``'s ``unused``), and
    leave the spec as it is.
    """

    static: Static
    step_key: Hashable
    frozen: frozenset[str] = frozenset()
    grad_mode: GradMode = "autograd"
    compile: str | None = None
    microbatch_size: int | None = None
    first_sample: int = 0
    processes: int = 1
    units_scale: float = 1.0
    donate: bool = False
    guard_failures: bool = False
    norms: bool = False
    reseed: bool = False
    sharded: bool = False

    @classmethod
    def of(
        cls, static: Static, step_key: Hashable, frozen: frozenset[str], execution: Execution, cut: Cut, *,
        units_scale: float, norms: bool,
    ) -> StepSpec:  # fmt: skip
        """Returns the spec of a run's step: ``execution``'s, on the batches ``cut`` cuts. The run owns its state: an
        eager step may update its tensors in place, unless a step that runs out of memory ('auto') is to be retried
        from the state before it; a compiled graph draws its seeds once, at its start."""
        backend = execution.compile if isinstance(execution.compile, str) else None  # a backend's name, once checked
        compiled = backend is not None
        return cls(
            static, step_key, frozen, grad_mode=execution.step_grad_mode, compile=backend,
            microbatch_size=cut.microbatch_size, first_sample=cut.first_sample, processes=cut.processes,
            units_scale=units_scale, donate=not compiled and not cut.auto, guard_failures=cut.auto and cut.processes > 1,
            norms=norms, reseed=not compiled, sharded=execution.parallelism is not None,
        )  # fmt: skip


@dataclass(frozen=True)
class StepBuilder:
    """What a run's steps share: its loss functions, optimizer and batch layout, the model's random draws
    (``reseed``: ``ModelDraws.reseed``) and the default loss's weights (``loss_units``)."""

    loss_fn: LossFn
    tx: GradientTransformation
    input_key: int | str | None = None
    per_sample_loss_fn: LossFn | None = None
    loss_units: Callable[[Any], Tensor] | None = None
    reseed: Callable[[int], None] | None = None

    def train_step(
        self,
        spec: StepSpec,
        plan: Plan,
        unused: frozenset[str] = frozenset(),
        backend: Callable[..., Any] | None = None,
    ) -> StepFn:
        """Returns the training step ``spec`` names, for ``plan`` (whose ``step_key`` is the spec's), compiled with
        ``backend`` when the spec has a ``compile`` backend. ``unused`` names the parameters the loss does not reach
        (a ``func``-mode step cannot tell them from ones with a zero gradient): they are left as frozen ones are."""
        summed = spec.processes > 1
        # A sharded module's backward sums its gradients over the processes as it computes them.
        overlap = distributed.Summation if summed and not spec.sharded else None
        step = make_train_step(
            spec.static,
            plan,
            self.loss_fn,
            self.tx,
            input_key=self.input_key,
            grad_mode=spec.grad_mode,
            per_sample_loss_fn=self.per_sample_loss_fn,
            donate=spec.donate,
            frozen=spec.frozen | unused,
            microbatch_size=spec.microbatch_size,
            first_sample=spec.first_sample,
            reduce=distributed.all_reduce_sum if summed else None,
            overlap=overlap,
            guard_failures=spec.guard_failures,
            norms=spec.norms,
            loss_units=self.loss_units,
            units_scale=spec.units_scale,
            reseed=self.reseed if spec.reseed else None,
            sharded=sharded_module(spec.static.module) if spec.sharded else None,
        )
        if spec.compile is not None:
            step = compile_step(step, backend if backend is not None else spec.compile)
        return step


    def unused(self, spec: StepSpec, plan: Plan, state: State, batch: Any, process_batch: int | None) -> frozenset[str]:
        """Returns the parameters the loss of ``spec``'s step does not reach on the first microbatch of ``batch`` (a
        process's batch of ``process_batch`` samples; None: none yet), found by an autograd step: a ``func``-mode
        step cannot tell them from ones with a zero gradient (``train_step``'s ``unused``)."""
        part = split_batch(batch, self.input_key, spec.microbatch_size or process_batch)[:1] if batch is not None else []
        if not part:
            return frozenset()
        return unused_parameters(
            spec.static, plan, self.loss_fn, state, part[0][1], input_key=self.input_key,
            per_sample_loss_fn=self.per_sample_loss_fn, frozen=spec.frozen,
        )  # fmt: skip


class StepCache:
    """Builds each distinct step of a run once, by its spec: training steps with ``builder``, evaluation steps by
    the static part, the plan's key and whether they predict. Compiled steps count the graphs they compile
    (``compiles``)."""

    def __init__(self, builder: StepBuilder) -> None:
        self.builder = builder
        self.compiles = 0
        """How many graphs the compiled steps compiled so far (a recompile counts)."""
        self._train: dict[StepSpec, StepFn] = {}
        self._eval: dict[tuple[Static, Hashable, bool, str | None], Callable[[State, Any], Any]] = {}

    def __contains__(self, spec: object) -> bool:
        """Returns whether the training step of ``spec`` is built."""
        return spec in self._train

    def train_step(self, spec: StepSpec, plan: Plan, unused: frozenset[str] = frozenset()) -> StepFn:
        """Returns the training step of ``spec`` for ``plan``, built on the first call (``unused``: see
        ``StepBuilder.train_step``, read only then)."""
        step = self._train.get(spec)
        if step is None:
            backend = self._counting(spec.compile) if spec.compile is not None else None
            step = self._train[spec] = self.builder.train_step(spec, plan, unused, backend)
        return step

    def forget(self, spec: StepSpec) -> None:
        """Drops the step of ``spec`` (one that ran out of memory is rebuilt with a smaller microbatch)."""
        self._train.pop(spec, None)

    def eval_step(
        self, static: Static, plan: Plan, predict: bool = False, compile: str | None = None
    ) -> Callable[[State, Any], Any]:
        """Returns the evaluation step (``make_eval_step``) of ``static`` and ``plan``, built on the first call."""
        key = (static, plan.step_key, predict, compile)
        step = self._eval.get(key)
        if step is None:
            step = make_eval_step(
                static, plan, input_key=self.builder.input_key, predict=predict, sharded=sharded_module(static.module)
            )
            if compile is not None:
                step = compile_step(step, self._counting(compile))
            self._eval[key] = step
        return step

    def _counting(self, name: str) -> Callable[..., Any]:
        from torch._dynamo import lookup_backend

        inner = lookup_backend(name)

        def backend(graph: Any, example_inputs: Any) -> Any:
            self.compiles += 1
            return inner(graph, example_inputs)

        return backend
