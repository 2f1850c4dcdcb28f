"""Checkpoint files: written atomically (temporary file, fsync, rename) and read with ``weights_only=True``.

A checkpoint holds every tensor of the ``State`` (parameters, buffers, optimizer and algorithm state as
flat leaf lists, hyperparameters, step, random key), the timestamp, and the algorithms' JSON configs. Pytree
structure is not pickled: loading rebuilds it from a template state made by the same trainer set-up, and a
mismatch is reported by name rather than loaded wrongly.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from composer_fn.core.algorithm import Algorithm, algorithms_from_json
from composer_fn.core.state import State
from composer_fn.core.time import Timestamp

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "checkpoint_algorithms",
    "with_recorded_surgeries",
    "Checkpoint",
    "FORMAT_VERSION",
]

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """What ``load_checkpoint`` read: the state, the timestamp and the algorithms' JSON configs."""

    state: State
    timestamp: Timestamp
    algorithms: str


def _leaves(tree: Any) -> list[Any]:
    return list(pytree.tree_leaves(tree))


def save_checkpoint(path: str | os.PathLike[str], state: State, timestamp: Timestamp, algorithms: str) -> Path:
    """Returns the path written: ``state``, ``timestamp`` and ``algorithms`` (JSON) saved atomically.

    The file appears complete or not at all: it is written to a temporary file in the same folder, flushed
    to disk, then renamed over ``path``.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT_VERSION,
        "params": dict(state.params),
        "buffers": dict(state.buffers),
        "opt": _leaves(state.opt),
        "algos": _leaves(state.algos),
        "algos_names": sorted(state.algos),
        "hparams": dict(state.hparams),
        "step": state.step,
        "key": state.key,
        "timestamp": timestamp.to_dict(),
        "algorithms": algorithms,
    }
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(payload, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def _check_tensors(kind: str, loaded: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    if loaded.keys() != expected.keys():
        missing = sorted(expected.keys() - loaded.keys())
        unexpected = sorted(loaded.keys() - expected.keys())
        raise ValueError(
            f"checkpoint {kind} do not match the model: missing {missing}, unexpected {unexpected}"
        )
    for name, tensor in loaded.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"checkpoint {kind[:-1]} {name!r} has shape {tuple(tensor.shape)}; "
                f"the model expects {tuple(expected[name].shape)}"
            )


def _unflatten(kind: str, leaves: list[Any], template: Any) -> Any:
    expected, spec = pytree.tree_flatten(template)
    if len(leaves) != len(expected):
        raise ValueError(
            f"checkpoint {kind} state holds {len(leaves)} tensors; this set-up expects {len(expected)} "
            "(was it saved with another optimizer or other algorithms?)"
        )
    for index, (leaf, want) in enumerate(zip(leaves, expected, strict=True)):
        if isinstance(want, Tensor) and (not isinstance(leaf, Tensor) or leaf.shape != want.shape):
            shape = tuple(leaf.shape) if isinstance(leaf, Tensor) else type(leaf).__name__
            raise ValueError(f"checkpoint {kind} state leaf {index} is {shape}; expected shape {tuple(want.shape)}")
    return pytree.tree_unflatten(leaves, spec)


def _read(path: str | os.PathLike[str], device: torch.device | str | None) -> dict[str, Any]:
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"load_path={str(path)!r} is not a checkpoint file")
    if source.stat().st_size == 0:
        raise ValueError(f"load_path={str(path)!r} is an empty file, not a checkpoint")
    try:
        payload = torch.load(source, map_location=device, weights_only=True)
    except (EOFError, OSError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        # A checkpoint is written whole or not at all (atomic rename): a file that does not read is not one. The
        # unpickler's own message would suggest loading without weights_only, which a checkpoint never needs.
        reason = type(error).__name__ if isinstance(error, pickle.UnpicklingError) else str(error).splitlines()[0]
        raise ValueError(
            f"load_path={str(path)!r} cannot be read as a checkpoint (truncated, or another kind of file): {reason}"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"{str(path)!r} is not a composer_fn checkpoint of format {FORMAT_VERSION} (found {found!r})")
    return payload


def checkpoint_algorithms(path: str | os.PathLike[str]) -> str:
    """Returns the JSON configs of the algorithms the checkpoint at ``path`` was trained with."""
    algorithms: str = _read(path, "cpu")["algorithms"]
    return algorithms


def load_checkpoint(
    path: str | os.PathLike[str],
    template: State,
    *,
    device: torch.device | str | None = None,
    algorithms: str | None = None,
) -> Checkpoint:
    """Returns the checkpoint at ``path``, its pytrees rebuilt on the structure of ``template``.

    The file is read with ``torch.load(weights_only=True)``: it can hold tensors and plain values only.
    With ``algorithms`` (JSON configs), a checkpoint trained with other algorithms is refused first.
    """
    payload = _read(path, device)
    if algorithms is not None and payload["algorithms"] != algorithms:
        raise ValueError(
            f"load_path={str(path)!r} was trained with algorithms {payload['algorithms']}; "
            f"this trainer has {algorithms}"
        )
    _check_tensors("params", payload["params"], dict(template.params))
    _check_tensors("buffers", payload["buffers"], dict(template.buffers))
    if payload["algos_names"] != sorted(template.algos):
        raise ValueError(
            f"checkpoint holds state for algorithms {payload['algos_names']}; "
            f"this trainer has {sorted(template.algos)}"
        )
    state = State(
        params=payload["params"],
        buffers=payload["buffers"],
        opt=_unflatten("optimizer", payload["opt"], template.opt),
        algos=_unflatten("algorithm", payload["algos"], template.algos),
        hparams=payload["hparams"],
        step=payload["step"],
        key=payload["key"],
    )
    return Checkpoint(state, Timestamp.from_dict(payload["timestamp"]), payload["algorithms"])


def with_recorded_surgeries(given: tuple[Algorithm, ...], load_path: str | Path) -> tuple[Algorithm, ...]:
    """Returns the algorithms to build a trainer with that resumes from ``load_path``.

    A checkpoint of a rewritten model holds the rewritten structure's tensors: a trainer given only the plain
    model (and no other algorithms) re-applies the recorded surgeries, in their order, before loading.
    """
    recorded = algorithms_from_json(checkpoint_algorithms(load_path))
    missing = [a for a in recorded if a not in given]
    rewrites = all(a.capabilities().rewrites is not None for a in missing)
    if missing and rewrites and all(a in recorded for a in given):
        return recorded
    return given
