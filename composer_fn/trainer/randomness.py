"""The model's own random draws (``nn.Dropout``, ``F.dropout``, attention dropout, a third-party stochastic depth)
as a function of the run's key and step.

Layers a user brings draw from torch's global generators, which a seed given to the trainer would not reach.
Around each training step the trainer seeds the generators of the CPU and of the run's device from the run's
key, the step and the place of the microbatch in the global batch, and puts their earlier state back after it:
two runs with one seed draw the same masks, a resumed run draws what the uninterrupted one drew at that step,
and nothing outside the step (a data loader's shuffle) sees a different generator than it would have.

An eager step reseeds before each microbatch from that microbatch's place, so a run on N processes with batch B
draws what one process with microbatches of B draws. A dropout mask is drawn per tensor, though: a run whose
batches are cut otherwise (another microbatch size, or a compiled step, which draws one batch of seeds for its
whole graph) draws other masks; ``ModelDraws.drew`` tells whether the model draws at all, for the warning
that says so.

A step that cannot draw (``draws_nothing``: a model built only of torch's deterministic layers and the keyed ones,
the run's own losses and methods) is left unseeded: seeding it would change nothing but its time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.modules import module as module_hooks

from composer_fn.core import random as R
from composer_fn.nn.keyed import KeyedDropout

__all__ = ["ModelDraws", "model_seed", "cut_draws_warning", "draws_nothing"]

# Layers whose training forward and backward compute without torch's generators (nn.RReLU, the dropouts and
# attention draw; a container without a forward of its own is only called through its parent's).
_DETERMINISTIC: frozenset[object] = frozenset(
    layer.forward
    for layer in (
        nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.Identity, nn.Flatten, nn.Unflatten,
        nn.Linear, nn.Bilinear, nn.Embedding, nn.EmbeddingBag,
        nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
        nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm,
        nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LocalResponseNorm,
        nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
        nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Softsign,
        nn.Softmax, nn.LogSoftmax, nn.Softmax2d, nn.GLU,
        nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
        nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
        nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
        nn.ZeroPad2d, nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d, nn.ReflectionPad2d, nn.ReplicationPad2d,
        nn.Upsample, nn.PixelShuffle, nn.PixelUnshuffle,
        KeyedDropout,
    )
)  # fmt: skip
_GLOBAL_HOOKS = (
    "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks"
)  # fmt: skip
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def draws_nothing(module: nn.Module) -> bool:
    """Returns whether training ``module`` provably draws nothing from torch's generators: each of its layers is of a
    kind that computes without them (torch's linear, convolution, normalisation, activation, pooling and container
    layers, ``KeyedDropout``), called as torch calls it (no hook, no forward or ``__call__`` of its own). Anything
    else (a forward of the user's, a dropout, a hook) may draw."""
    if any(getattr(module_hooks, hooks) for hooks in _GLOBAL_HOOKS):
        return False
    return all(
        getattr(type(layer), "forward", None) in _DETERMINISTIC
        and type(layer).__call__ is nn.Module.__call__
        and "forward" not in vars(layer)
        and not any(getattr(layer, hooks, None) for hooks in _HOOKS)
        for layer in module.modules()
    )


def model_seed(seed: int, step: int, offset: int = 0) -> int:
    """Returns the seed torch's generators hold for the model's draws at ``step`` (the optimizer steps taken
    before it) in the microbatch whose first sample is at ``offset`` of the global batch, in a run of ``seed``:
    what a hand-written loop seeds to draw the masks a run draws."""
    return _seed_of(R.host_key(seed), step, offset)


def _seed_of(root: tuple[int, int], step: int, offset: int) -> int:
    word0, word1 = R.host_fold_in(R.host_fold_in(root, step), offset)
    return (word0 << 32) | word1


class ModelDraws:
    """Seeds torch's generators for the model's own draws at each step (see the module docstring).

    ``enter`` and ``leave`` bracket a step (the trainer's hot path); ``around`` is the same as a context manager.
    The seeds of a stretch of steps at one offset are computed together, on tensors, as ``model_seed`` computes
    each on Python ints. While ``quiet`` (the step cannot draw: see ``draws_nothing``), they leave the generators
    alone.
    """

    _STRETCH = 256

    def __init__(self, seed: int, device: torch.device) -> None:
        self._root = R.host_key(seed)
        self._generators = [torch.default_generator]
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._generators.append(torch.cuda.default_generators[index])
        self._step: int | None = None
        self._seeded: list[torch.Tensor] = []
        # By offset (a process's, or its microbatches'): the seeds of the steps [first, first + len(seeds)).
        self._stretches: dict[int, tuple[int, list[int]]] = {}
        self.drew: bool | None = None
        """Whether the model drew from the generators in the first step seeded (None before it)."""
        self.quiet = False
        """Whether the step cannot draw (see ``draws_nothing``): it runs unseeded."""

    def set_quiet(self, quiet: bool) -> None:
        """Sets ``quiet``: whether the step cannot draw (see ``draws_nothing``)."""
        if quiet != self.quiet:
            self.quiet, self.drew = quiet, False if quiet else None

    def enter(self, step: int, offset: int) -> list[torch.Tensor]:
        """Seeds the generators for ``step`` and the step's first sample at ``offset`` of the global batch;
        returns their earlier state, for ``leave`` (nothing, and nothing seeded, while ``quiet``)."""
        if self.quiet:
            return []
        saved = list(map(torch.Generator.get_state, self._generators))
        self._step = step
        self._seed(step, offset)
        return saved

    def leave(self, saved: list[torch.Tensor], completed: bool = True) -> None:
        """Puts back the generators' state from before ``enter``; after the first ``completed`` step, learns whether
        the model drew."""
        if not saved:
            return
        if completed and self.drew is None:
            self.drew = any(
                not torch.equal(generator.get_state(), seeded)
                for generator, seeded in zip(self._generators, self._seeded, strict=True)
            )
        self._step = None
        for generator, state in zip(self._generators, saved, strict=True):
            generator.set_state(state)

    @contextlib.contextmanager
    def around(self, step: int, offset: int) -> Iterator[None]:
        """Runs the block (one training step) with the generators seeded for ``step`` and the step's first
        sample at ``offset`` of the global batch; their earlier state is put back after it."""
        saved = self.enter(step, offset)
        completed = False
        try:
            yield
            completed = True
        finally:
            self.leave(saved, completed)

    def reseed(self, offset: int) -> None:
        """Seeds the generators for the microbatch whose first sample is at ``offset`` of the global batch (a
        no-op outside ``around`` and inside a compiled graph)."""
        if self._step is not None and not torch.compiler.is_compiling():
            self._seed(self._step, offset)

    def _seed(self, step: int, offset: int) -> None:
        first, seeds = self._stretches.get(offset, (step, []))
        if not 0 <= step - first < len(seeds):
            if len(self._stretches) >= self._STRETCH:
                self._stretches.clear()
            first, seeds = self._stretches[offset] = (step, _seeds(self._root, step, self._STRETCH, offset))
        seed = seeds[step - first]
        for generator in self._generators:
            generator.manual_seed(seed)
        if self.drew is None:
            self._seeded = [generator.get_state() for generator in self._generators]


def _seeds(root: tuple[int, int], first: int, count: int, offset: int) -> list[int]:
    # _seed_of for the steps [first, first + count) at once: the same folds, on tensors.
    steps = torch.arange(first, first + count, dtype=torch.int64)
    keys = R.fold_in(R.fold_in(R.from_host(root), steps), torch.tensor(offset, dtype=torch.int64))
    return [seed % 2**64 for seed in ((keys[:, 0] << 32) | keys[:, 1]).tolist()]  # int64 to the unsigned seed


def cut_draws_warning(model: str, processes: int) -> str:
    """Returns the warning of a run whose model (named ``model``) draws random numbers of its own and whose batches
    are cut into microbatches, on ``processes`` processes: a mask is drawn per tensor, so its draws are those of that
    cut."""
    over = f" over {processes} processes" if processes > 1 else ""
    return (
        f"{model} draws random numbers of its own in training (dropout), and this run cuts its batches into "
        f"microbatches{over}: a mask is drawn per tensor, so its draws are those of runs with the same microbatch "
        "size (on any number of processes), not those of a run that cuts its batches otherwise; everything else is "
        "the same, and the run is reproducible from its seed"
    )
