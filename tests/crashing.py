"""A callback that ends a run the way a killed process ends it, for the tests of resuming."""

from __future__ import annotations

from composer_fn.callbacks.base import Callback, RunView


class Crash(Callback):
    """Ends the process's run at the start of a batch, after the checkpoints before it were written."""

    def __init__(self, at: int) -> None:
        self.at = at

    def batch_start(self, view: RunView) -> None:
        if view.timestamp.batch == self.at:
            raise KeyboardInterrupt(f"crash at batch {self.at}")
