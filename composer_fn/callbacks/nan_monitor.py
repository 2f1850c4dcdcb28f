"""``NaNMonitor``: ends a run at the first step whose weights stopped being finite, naming the step and tensor."""

from __future__ import annotations

import warnings

import torch

from composer_fn.callbacks.base import Callback, RunView
from composer_fn.core import validate

__all__ = ["NaNMonitor"]


class NaNMonitor(Callback):
    """Raises ``FloatingPointError`` at the end of the first checked step whose parameters or floating-point
    buffers hold a NaN or an infinity, naming the step and the first such tensor in module order.

    It reads the state and changes nothing; the error ends ``fit()`` before the next step, so the last
    checkpoint written is from before the divergence. The check reads device memory once per checked step
    (one host synchronisation): ``interval`` checks every that many steps instead (at steps that are multiples
    of it); a run whose steps include no such multiple is warned about as it starts: nothing would be checked.
    """

    def __init__(self, interval: int = 1) -> None:
        self.interval = validate.integer("interval", interval, minimum=1, hint="steps between checks")

    def fit_start(self, view: RunView) -> None:
        """Warns when the run has no step at a multiple of ``interval``, so that nothing would be checked."""
        first, last = view.timestamp.batch, view.max_steps
        if last > first and last // self.interval == first // self.interval:
            warnings.warn(
                f"NaNMonitor(interval={self.interval}) checks at steps that are multiples of {self.interval}, but "
                f"this run trains steps {first + 1} to {last} (a run of {last} steps): it never checks; pass an "
                f"interval of at most {last}",
                UserWarning,
                stacklevel=2,
            )

    def batch_end(self, view: RunView) -> None:
        """Raises ``FloatingPointError`` when a checked step's parameters or buffers are not all finite."""
        step = view.timestamp.batch
        if step % self.interval:
            return
        tensors = [("parameter", name, t) for name, t in view.state.params.items()]
        tensors += [("buffer", name, t) for name, t in view.state.buffers.items() if t.is_floating_point()]
        if not tensors or bool(torch.stack([torch.isfinite(t).all() for _, _, t in tensors]).all()):
            return
        kind, name, _ = next(entry for entry in tensors if not bool(torch.isfinite(entry[2]).all()))
        raise FloatingPointError(
            f"step {step} (epoch {view.timestamp.epoch}): {kind} {name!r} holds NaN or infinity; the run diverged "
            "(a lower learning rate, gradient clipping or bf16 instead of fp16 are the usual remedies)"
        )
