"""Several processes (``torchrun``): the process group, the gradient sum, and what rank 0 does for all.

A run of N processes is the one-process run of the global batch cut into device microbatches: each rank
computes its microbatches' loss-weighted gradient sums, ``all_reduce_sum`` adds them across ranks (one
collective per bucket, eagerly and inside a compiled step; eagerly, ``Summation`` issues each bucket from the
backward as soon as its gradients are in), and every rank divides by the global sample count. Nothing else in the package talks to ``torch.distributed`` except
through this module, and ``sharding`` (torch's FSDP2 over a device mesh).

BatchNorm running statistics never differ between ranks: each microbatch's update starts from the step's
statistics and the step keeps their average over the global batch's microbatches, summed in the same
all-reduce as the gradients (a few kilobytes more). So evaluations and checkpoints need no synchronisation
(timm's ``distribute_bn``) and the statistics, too, are those of the one-process run.
"""

from __future__ import annotations

import atexit
import datetime
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from composer_fn.core import validate

__all__ = [
    "attempt_step",
    "grouped",
    "Summation",
    "World",
    "all_reduce_sum",
    "check_loader",
    "is_out_of_memory",
    "setup",
]

BUCKET_BYTES = 25 * 2**20
"""The most bytes one all-reduce carries (as DDP's default bucket)."""

_ENVIRONMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class World:
    """The processes of a run: this one's ``rank`` and ``local_rank`` among ``size``, whose collectives fail
    after ``timeout`` seconds."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    timeout: float = 300.0

    @property
    def main(self) -> bool:
        """Returns whether this process is rank 0, the one that writes files."""
        return self.rank == 0

    def barrier(self) -> None:
        """Waits for every rank (nothing to wait for in one process)."""
        if self.size > 1:
            dist.barrier()

    def broadcast(self, value: Any) -> Any:
        """Returns rank 0's ``value`` (a picklable object) on every rank."""
        if self.size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, values: list[float]) -> list[float]:
        """Returns every rank's ``values`` concatenated in rank order (a collective: every rank calls it)."""
        if self.size == 1:
            return values
        parts: list[Any] = [None] * self.size
        dist.all_gather_object(parts, values)
        return [value for part in parts for value in part]


def environment_world() -> World | None:
    """Returns the world torchrun describes in the environment, or None when it describes none."""
    if "WORLD_SIZE" not in os.environ:
        return None
    values = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        text = os.environ.get(name, "0")
        if not text.isdigit():
            raise ValueError(f"environment variable {name}={text!r}: expected a non-negative integer (as torchrun sets)")
        values[name] = int(text)
    if values["WORLD_SIZE"] < 1 or values["RANK"] >= values["WORLD_SIZE"]:
        raise ValueError(
            f"environment RANK={values['RANK']}, WORLD_SIZE={values['WORLD_SIZE']}: expected 0 <= RANK < WORLD_SIZE"
        )
    return World(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"])


def grouped() -> bool:
    """Returns whether this process is in an initialised process group."""
    return dist.is_available() and dist.is_initialized()


def local_device(device: torch.device | None) -> torch.device | None:
    """Returns the device a torchrun process trains on when none was given: its ``LOCAL_RANK``-th GPU."""
    world = environment_world()
    if device is not None or world is None or world.size == 1 or not torch.cuda.is_available():
        return device
    return torch.device("cuda", world.local_rank % torch.cuda.device_count())


def setup(device: torch.device, timeout: float) -> World:
    """Returns this process's world, joining the process group torchrun's environment describes if needed.

    A group the caller already initialised is used as it is. Otherwise, with ``WORLD_SIZE`` > 1 in the
    environment (``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` too), the process joins a group
    with NCCL on CUDA and gloo on the CPU, whose collectives fail after ``timeout`` seconds. Without either, it
    is one process.
    """
    seconds = validate.real("dist_timeout", timeout, minimum=0.0, open_below=True)
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), _local_rank(), seconds)
    world = environment_world()
    if world is None or world.size == 1:
        return World()
    missing = [name for name in _ENVIRONMENT if name not in os.environ]
    if missing:
        raise ValueError(
            f"WORLD_SIZE={world.size} is set but {', '.join(missing)} are not: launch with torchrun, which sets "
            f"{', '.join(_ENVIRONMENT)}"
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        timeout=datetime.timedelta(seconds=seconds),
        device_id=device if device.type == "cuda" else None,
    )
    # The group this process joined is left before the interpreter exits: left to the C++ destructors, its
    # threads may still be running and abort the process (SIGABRT) after a run that went well.
    atexit.register(_leave)
    return World(dist.get_rank(), dist.get_world_size(), world.local_rank, seconds)


def _leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def explained(error: RuntimeError, world: World, step: int) -> RuntimeError:
    """Returns ``error`` itself, or, for a failed collective of a run of several processes, an error saying so."""
    text = str(error)
    collective = isinstance(error, dist.DistError) or any(
        word in text for word in ("gloo", "NCCL", "Connection reset", "Connection closed", "timed out", "Timeout")
    )
    if world.size == 1 or not collective:
        return error
    return RuntimeError(
        f"rank {world.rank} of {world.size}: step {step} failed in a collective: another process exited, or did "
        f"not answer within dist_timeout={world.timeout:g} s ({text.splitlines()[0] if text else type(error).__name__})"
    )


def _local_rank() -> int:
    text = os.environ.get("LOCAL_RANK", "")
    return int(text) if text.isdigit() else 0


def _buckets(tensors: Sequence[Tensor]) -> list[list[int]]:
    # Consecutive tensors of one dtype, at most BUCKET_BYTES a bucket (a larger tensor alone); buckets close in
    # the order of their last member.
    buckets: list[list[int]] = []
    current: dict[torch.dtype, tuple[list[int], int]] = {}
    for index, tensor in enumerate(tensors):
        members, size = current.get(tensor.dtype, ([], 0))
        nbytes = tensor.numel() * tensor.element_size()
        if members and size + nbytes > BUCKET_BYTES:
            buckets.append(members)
            members, size = [], 0
        current[tensor.dtype] = ([*members, index], size + nbytes)
    buckets.extend(members for members, _ in current.values())
    return buckets


def _split(flat: Tensor, members: Sequence[int], tensors: Sequence[Tensor], into: list[Tensor]) -> None:
    pieces = flat.split([tensors[i].numel() for i in members])
    for i, piece in zip(members, pieces, strict=True):
        into[i] = piece.view(tensors[i].shape)


class Summation:
    """The sum over every rank of tensors like ``templates``, given one by one (``add``), eagerly.

    The tensors are cut into buckets as ``all_reduce_sum`` cuts them; a bucket's all-reduce is issued, in place
    on a flat copy, as soon as it and every bucket before it are complete. Fed from the backward's gradient
    hooks, the sums travel while the backward runs, as DDP's do; buckets go out in the same order on every
    rank whatever order the gradients come in.
    """

    def __init__(self, templates: Sequence[Tensor]) -> None:
        group = dist.group.WORLD
        assert group is not None, "Summation needs an initialised process group"
        self._name = group.group_name
        self._buckets = _buckets(templates)
        self._bucket_of = {index: number for number, members in enumerate(self._buckets) for index in members}
        self._missing = [len(members) for members in self._buckets]
        self._given: dict[int, Tensor] = {}
        self._issued: list[Tensor] = []

    def add(self, index: int, tensor: Tensor) -> None:
        """Gives the ``index``-th tensor (not to be changed until ``result``)."""
        self._given[index] = tensor
        self._missing[self._bucket_of[index]] -= 1
        while len(self._issued) < len(self._buckets) and self._missing[len(self._issued)] == 0:
            members = self._buckets[len(self._issued)]
            flat = torch.cat([self._given[i].reshape(-1) for i in members])
            self._issued.append(torch.ops._c10d_functional.all_reduce_(flat, "sum", self._name))

    def result(self, tensors: Sequence[Tensor]) -> list[Tensor]:
        """Returns the sums of ``tensors``, giving those not given yet."""
        for index, tensor in enumerate(tensors):
            if index not in self._given:
                self.add(index, tensor)
        result: list[Tensor] = list(tensors)
        for members, flat in zip(self._buckets, self._issued, strict=True):
            _split(torch.ops._c10d_functional.wait_tensor(flat), members, tensors, result)
        return result


def all_reduce_sum(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Returns the sums of ``tensors`` over every rank, by a few coalesced all-reduces.

    Consecutive tensors of one dtype are flattened into buckets of at most ``BUCKET_BYTES``; every bucket's
    all-reduce is issued before any is read. Eagerly each is summed in place on its flat copy (``Summation``);
    inside a compiled step the collectives are functional (``torch.distributed._functional_collectives``), part
    of the step's graph, and the buckets are the same.
    """
    if not torch.compiler.is_compiling():
        return Summation(tensors).result(tensors)
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    assert group is not None, "all_reduce_sum needs an initialised process group"
    buckets = _buckets(tensors)
    reduced = [funcol.all_reduce(torch.cat([tensors[i].reshape(-1) for i in m]), "sum", group) for m in buckets]
    result: list[Tensor] = list(tensors)
    for members, flat in zip(buckets, reduced, strict=True):
        _split(funcol.wait_tensor(flat), members, tensors, result)
    return result


def check_loader(loader: object, argument: str, world: World, *, evaluation: bool = False) -> None:
    """Raises ``ValueError`` for a torch ``DataLoader`` that would give every rank the same samples (or, for
    evaluation, repeat samples to pad the last batch)."""
    if world.size == 1 or not isinstance(loader, torch.utils.data.DataLoader):
        return
    sampler = loader.sampler
    if not isinstance(sampler, torch.utils.data.DistributedSampler):
        raise ValueError(
            f"{argument} is a DataLoader without a DistributedSampler under {world.size} processes: every rank would "
            "read the same samples. Pass sampler=torch.utils.data.DistributedSampler(dataset) (the trainer calls "
            "set_epoch), or use composer_fn.data.TensorLoader, which shards by rank itself"
        )
    if sampler.num_replicas != world.size:
        raise ValueError(
            f"{argument}'s DistributedSampler has num_replicas={sampler.num_replicas}; the run has {world.size} "
            "processes: build it after the process group, or with num_replicas=world size"
        )
    if evaluation and sampler.total_size != len(sampler.dataset):  # type: ignore[arg-type]
        raise ValueError(
            f"{argument}'s DistributedSampler pads {len(sampler.dataset)} samples to "  # type: ignore[arg-type]
            f"{sampler.total_size} by repeating some, which an evaluation would count twice: use "
            "composer_fn.data.TensorLoader (shuffle=False), which shards without repeating"
        )


_OUT_OF_MEMORY = (
    "out of memory",
    "CUDNN_STATUS_NOT_SUPPORTED",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)


def is_out_of_memory(error: BaseException) -> bool:
    """Returns whether ``error`` is a device allocation failure, in any of the forms torch raises it."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(text in str(error) for text in _OUT_OF_MEMORY)


def attempt_step(
    run: Callable[[], tuple[Any, dict[str, Tensor]]],
    world: World,
    step: int,
    on_out_of_memory: Callable[[], None],
) -> tuple[Any, dict[str, Tensor]] | None:
    """Returns ``run()``'s state and outputs, or None where the step ran out of device memory on any process: every
    process agrees, as a process that failed calls ``on_out_of_memory`` to join the others' sum with a failure mark
    and all then read an infinite sample count. Any other error is raised (a failed collective explained)."""
    try:
        state, outputs = run()
    except Exception as error:  # noqa: BLE001 -- only out-of-memory errors are caught; others re-raise
        if not is_out_of_memory(error):
            if isinstance(error, RuntimeError):
                raise explained(error, world, step) from error
            raise
        if world.size > 1:
            on_out_of_memory()
        return None
    if world.size > 1 and not math.isfinite(float(outputs["samples"])):
        return None
    return state, outputs
