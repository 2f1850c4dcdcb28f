"""Training-loop events: Composer's 40 names, each run either on the host or inside the traced step.

Host events run eagerly between steps and may change the ``Static`` spec (surgery) or ``State`` from Python
values. Traced events run inside the (possibly compiled) step function and hold pure tensor code only.

One event is ours: ``AFTER_OPTIMIZER_STEP``, traced, right after the gradient transformation has produced the
new parameters and before ``BATCH_END``. Weight averaging (EMA, SWA) hooks there, so it runs inside the
compiled step on the freshly updated parameters.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Event", "HOST_EVENTS", "TRACED_EVENTS", "TRAIN_STEP_EVENTS"]


class Event(str, Enum):
    """A point in the training loop at which algorithms may run."""

    INIT = "init"
    BEFORE_LOAD = "before_load"
    AFTER_LOAD = "after_load"
    FIT_START = "fit_start"
    ITERATION_START = "iteration_start"
    EPOCH_START = "epoch_start"
    BEFORE_DATALOADER = "before_dataloader"
    AFTER_DATALOADER = "after_dataloader"
    BATCH_START = "batch_start"
    BEFORE_TRAIN_BATCH = "before_train_batch"
    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"
    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"
    AFTER_TRAIN_BATCH = "after_train_batch"
    AFTER_OPTIMIZER_STEP = "after_optimizer_step"
    BATCH_END = "batch_end"
    BATCH_CHECKPOINT = "batch_checkpoint"
    EPOCH_END = "epoch_end"
    EPOCH_CHECKPOINT = "epoch_checkpoint"
    ITERATION_END = "iteration_end"
    ITERATION_CHECKPOINT = "iteration_checkpoint"
    FIT_END = "fit_end"
    EVAL_BEFORE_ALL = "eval_before_all"
    EVAL_START = "eval_start"
    EVAL_BATCH_START = "eval_batch_start"
    EVAL_BEFORE_FORWARD = "eval_before_forward"
    EVAL_AFTER_FORWARD = "eval_after_forward"
    EVAL_BATCH_END = "eval_batch_end"
    EVAL_END = "eval_end"
    EVAL_AFTER_ALL = "eval_after_all"
    EVAL_STANDALONE_START = "eval_standalone_start"
    EVAL_STANDALONE_END = "eval_standalone_end"
    PREDICT_START = "predict_start"
    PREDICT_BATCH_START = "predict_batch_start"
    PREDICT_BEFORE_FORWARD = "predict_before_forward"
    PREDICT_AFTER_FORWARD = "predict_after_forward"
    PREDICT_BATCH_END = "predict_batch_end"
    PREDICT_END = "predict_end"

    @property
    def traced(self) -> bool:
        """Returns whether the event runs inside the traced step (pure tensor code) rather than on the host."""
        return self in TRACED_EVENTS

    @property
    def is_before(self) -> bool:
        """Returns whether the event opens a before/after (or start/end) pair."""
        return self in _PARTNERS

    @property
    def is_after(self) -> bool:
        """Returns whether the event closes a before/after (or start/end) pair."""
        return self in _OPENERS

    @property
    def partner(self) -> Event | None:
        """Returns the other half of the event's pair, or None for unpaired events."""
        return _PARTNERS.get(self) or _OPENERS.get(self)

    @property
    def canonical_name(self) -> str:
        """Returns the name without its before/after/start/end marker (Composer's ``canonical_name``)."""
        name = self.value
        for marker in ("before_", "after_"):
            name = name.replace(marker, "")
        for marker in ("_start", "_end"):
            if name.endswith(marker):
                name = name[: -len(marker)]
        return name

    @property
    def is_eval(self) -> bool:
        """Returns whether the event belongs to evaluation."""
        return self.value.startswith("eval_")

    @property
    def is_predict(self) -> bool:
        """Returns whether the event belongs to prediction."""
        return self.value.startswith("predict_")


# Composer pairs events by name: before_X with after_X, X_start with X_end.
_PAIRS = tuple(
    (event, Event(event.value.replace("before_", "after_") if "before_" in event.value else event.value[:-6] + "_end"))
    for event in Event
    if "before_" in event.value or event.value.endswith("_start")
)
_PARTNERS = {before: after for before, after in _PAIRS}
_OPENERS = {after: before for before, after in _PAIRS}

TRAIN_STEP_EVENTS: tuple[Event, ...] = (
    Event.AFTER_DATALOADER,
    Event.BEFORE_TRAIN_BATCH,
    Event.BEFORE_FORWARD,
    Event.AFTER_FORWARD,
    Event.BEFORE_LOSS,
    Event.AFTER_LOSS,
    Event.BEFORE_BACKWARD,
    Event.AFTER_BACKWARD,
    Event.AFTER_TRAIN_BATCH,
    Event.AFTER_OPTIMIZER_STEP,
)
"""The traced events of one training step, in the order the step runs them."""

_FORWARDS = (Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD, Event.PREDICT_BEFORE_FORWARD, Event.PREDICT_AFTER_FORWARD)
TRACED_EVENTS: frozenset[Event] = frozenset(TRAIN_STEP_EVENTS + _FORWARDS)
HOST_EVENTS: frozenset[Event] = frozenset(Event) - TRACED_EVENTS
