"""Checkpoint files: written atomically (temporary file, fsync, rename, fsync of the folder) and read with
``weights_only=True``.

A checkpoint holds every tensor of the ``State`` (parameters, buffers, optimizer and algorithm state as
flat leaf lists, hyperparameters, step, random key), the timestamp, the run's ``max_duration`` and the
algorithms' JSON configs; a weights-only checkpoint holds the parameters and buffers alone. Pytree structure is
not pickled: loading rebuilds it from a template state made by the same trainer set-up, and a mismatch is
reported by name rather than loaded wrongly. An algorithm's state record saves its tensors field by field in the
order of its fields, as a dictionary of those fields would (EMA's state was one, and its checkpoints load as they
are); a record once saved in another layout (EarlyStopper's five values in one tensor) reads that one too.
``load_weights`` starts a new run (another optimizer, other algorithms) from a checkpoint's weights, optionally
ignoring names.

In a save folder, checkpoints are named ``ep{epoch}-ba{batch}.pt``: ``newest_checkpoint`` finds the latest
complete one (temporary files of an interrupted write are never taken), ``prune_checkpoints`` keeps the newest
few, and ``remove_stale_temporaries`` deletes what a killed writer left behind.

A sharded run (``FSDP``) saves folders, ``ep{epoch}-ba{batch}``, each process writing its own shards
(``sharded_files``), under a temporary name until the whole is written: a folder of that name is complete, and the
newest of files and folders is the one a run resumes from. ``save_sharded_to_folder`` writes one,
``load_sharded_checkpoint`` reads one into a run of any number of processes.

A save folder or a checkpoint may be a URL of an object store (``object_store``): checkpoint files are written
locally and uploaded whole, sharded ones written there by every process, and ``latest`` (an object naming the
newest) moves last; the newest complete one is found by listing the bucket.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import pickle
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from composer_fn.core.algorithm import Algorithm, algorithms_from_json
from composer_fn.core.extras import install_command
from composer_fn.core.records import from_earlier_layout
from composer_fn.core.state import State
from composer_fn.core.time import Timestamp
from composer_fn.optim.base import in_layout_of
from composer_fn.trainer.checks import first_line
from composer_fn.trainer.object_store import LATEST, ObjectFolder, fetched_file, is_url, local_path, resolved
from composer_fn.trainer.sharded_files import (
    INFO,
    is_sharded_checkpoint,
    read_info,
    whole_payload,
    write_info,
    write_shards,
)

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "load_weights",
    "newest_checkpoint",
    "prune_checkpoints",
    "remove_stale_temporaries",
    "checkpoint_name",
    "autoresume_path",
    "prepare_folder",
    "save_to_folder",
    "resume_run",
    "checkpoint_algorithms",
    "recorded_algorithms",
    "with_recorded_surgeries",
    "Checkpoint",
    "FORMAT_VERSION",
    "read_checkpoint",
    "unflatten_tree",
    "checkpoint_metadata",
    "save_sharded_to_folder",
    "load_sharded_checkpoint",
    "convert_checkpoint",
    "CONVERSIONS",
    "save_run",
]

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """What ``load_checkpoint`` read: the state, the timestamp and the algorithms' JSON configs."""

    state: State
    timestamp: Timestamp
    algorithms: str
    max_duration: str | None
    """The ``max_duration`` of the run that wrote it (``'8ba'``), None if it had none."""


def _leaves(tree: Any) -> list[Any]:
    return list(pytree.tree_leaves(tree))


def checkpoint_name(timestamp: Timestamp, *, sharded: bool = False) -> str:
    """Returns the name of the checkpoint at ``timestamp`` in a save folder: the file ``ep{epoch}-ba{batch}.pt``, or
    with ``sharded`` the folder ``ep{epoch}-ba{batch}``."""
    return f"ep{timestamp.epoch}-ba{timestamp.batch}" + ("" if sharded else ".pt")


_NAME = re.compile(r"ep(\d+)-ba(\d+)(\.pt)?")
_TEMPORARY = re.compile(r"\..+\.tmp")


def save_checkpoint(
    path: str | os.PathLike[str],
    state: State,
    timestamp: Timestamp,
    algorithms: str,
    *,
    weights_only: bool = False,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Returns the path written: ``state``, ``timestamp`` and ``algorithms`` (JSON) saved atomically.

    The file appears complete or not at all: it is written to a temporary file in the same folder, flushed
    to disk, renamed over ``path``, and the folder is flushed so the rename survives a crash. With
    ``weights_only``, the file holds the parameters and buffers (and the timestamp) only. ``metadata`` (plain
    values: strings, numbers, lists, dicts) is stored as given, e.g. how to rebuild the model.
    """
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"path={str(path)!r} is a folder: expected the path of the checkpoint file to write, e.g. {str(target / 'run.pt')!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "weights_only": weights_only,
        "params": dict(state.params),
        "buffers": dict(state.buffers),
        "timestamp": timestamp.to_dict(),
        "max_duration": None if timestamp.max_duration is None else str(timestamp.max_duration),
        "algorithms": algorithms,
        "metadata": dict(metadata or {}),
    }
    if not weights_only:
        payload.update(
            opt=_leaves(state.opt),
            algos=_leaves(state.algos),
            algos_names=sorted(state.algos),
            hparams=dict(state.hparams),
            step=state.step,
            key=state.key,
        )
    return _written(target, lambda stream: torch.save(payload, stream))


def _written(target: Path, write: Callable[[Any], None]) -> Path:
    # ``write(stream)`` into a temporary file beside ``target``, flushed, renamed over it, and the rename flushed.
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    sync_folder(target.parent)
    return target


CONVERSIONS = ("torch", "safetensors")
"""What ``convert_checkpoint`` writes: a checkpoint file, or the parameters as safetensors."""


def convert_checkpoint(
    source: str | os.PathLike[str], output: str | os.PathLike[str], *, format: str = "torch"
) -> Path:
    """Returns ``output``, written atomically from the checkpoint at ``source`` (a file or a sharded folder, read
    whole by this process): with ``format='torch'`` one checkpoint file (``torch.save``) that every reader of a
    checkpoint takes, with ``'safetensors'`` the training parameters by name (a Hugging Face model's
    ``from_pretrained`` reads them beside its config; a weight tied to another is stored once, under its first
    name; the weights an evaluation used, EMA's average where the run had EMA, are ``load_model``'s)."""
    if format not in CONVERSIONS:
        raise ValueError(f"format={format!r}: expected one of {', '.join(CONVERSIONS)}")
    target = Path(output)
    if target.is_dir():
        raise ValueError(f"output={str(output)!r} is a folder: expected the path of the file to write")
    payload = read_checkpoint(source, "cpu", argument="checkpoint")
    target.parent.mkdir(parents=True, exist_ok=True)
    if format == "torch":
        return _written(target, lambda stream: torch.save(payload, stream))
    try:
        from safetensors.torch import save
    except ModuleNotFoundError:
        raise ValueError(f"format='safetensors' needs the safetensors package: {install_command('hf')}") from None
    tensors = {name: tensor.contiguous() for name, tensor in payload["params"].items()}
    return _written(target, lambda stream: stream.write(save(tensors, metadata={"format": "pt"})))


def sync_folder(folder: Path) -> None:
    """Flushes ``folder``'s entries (a rename into it) to disk, where the platform allows it."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # Some file systems refuse fsync on a folder; the rename itself is still atomic.
    finally:
        os.close(descriptor)


SaveFolder = Path | ObjectFolder
"""Where a run's checkpoints go: a local folder, or a folder in an object store."""


def save_folder_of(location: str | os.PathLike[str], *, argument: str = "save_folder") -> SaveFolder:
    """Returns the save folder ``location`` names: a folder in an object store for a URL (``s3://bucket/run``:
    checked, ``ObjectFolder``), else a local path (``file://`` taken off)."""
    if is_url(location):
        assert isinstance(location, str)
        return ObjectFolder(location, argument=argument)
    return Path(local_path(location))


def _numbered(folder: SaveFolder) -> list[tuple[int, str]]:
    # The complete checkpoints of a save folder by batch, oldest first, by name (``latest`` and temporary files
    # excluded). In a bucket a checkpoint file is complete once it is there (uploaded in one put), a sharded folder
    # once it holds the run's facts.
    found = []
    if isinstance(folder, ObjectFolder):
        for name in folder.names():
            match = _NAME.fullmatch(name)
            if match is not None and (match.group(3) or folder.exists(f"{name}/{INFO}")):
                found.append((int(match.group(2)), name))
        return sorted(found)
    for path in folder.iterdir() if folder.is_dir() else ():
        match = _NAME.fullmatch(path.name)
        if match is None or path.is_symlink():
            continue
        if path.is_file() if match.group(3) else is_sharded_checkpoint(path):
            found.append((int(match.group(2)), path.name))
    return sorted(found)


def _within(folder: SaveFolder, name: str) -> Path | str:
    return folder.path(name) if isinstance(folder, ObjectFolder) else folder / name


def newest_checkpoint(folder: str | os.PathLike[str] | ObjectFolder) -> Path | str | None:
    """Returns the checkpoint of the latest batch in ``folder`` (files are complete: writes are atomic), or None;
    in a bucket (a URL, or an ``ObjectFolder``), its URL."""
    where = folder if isinstance(folder, ObjectFolder) else save_folder_of(folder)
    numbered = _numbered(where)
    return _within(where, numbered[-1][1]) if numbered else None


def prune_checkpoints(folder: str | os.PathLike[str] | ObjectFolder, keep: int) -> list[Path | str]:
    """Removes all but the ``keep`` newest checkpoints of ``folder`` (-1 keeps all); returns the removed paths."""
    where = folder if isinstance(folder, ObjectFolder) else save_folder_of(folder)
    numbered = _numbered(where)
    removed = [name for _, name in numbered[: max(len(numbered) - keep, 0)]] if keep >= 0 else []
    for name in removed:
        if isinstance(where, ObjectFolder):
            where.remove(name)
        elif (where / name).is_dir():
            shutil.rmtree(where / name, ignore_errors=True)
        else:
            (where / name).unlink(missing_ok=True)
    return [_within(where, name) for name in removed]


def remove_stale_temporaries(folder: str | os.PathLike[str] | ObjectFolder) -> list[Path | str]:
    """Removes what an interrupted write left in ``folder`` (temporary files; in a bucket, sharded folders without
    the run's facts); returns their paths.

    Only for a folder no other writer is using: a temporary file is a write in progress until it is renamed.
    """
    if isinstance(folder, ObjectFolder):
        partial = [
            name
            for name in folder.names()
            if (match := _NAME.fullmatch(name)) is not None and not match.group(3) and not folder.exists(f"{name}/{INFO}")
        ]
        for name in partial:
            folder.remove(name)
        return [folder.path(name) for name in partial]
    stale = [path for path in Path(folder).glob(".*.tmp") if _TEMPORARY.fullmatch(path.name) and not path.is_symlink()]
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return list(stale)


def _check_tensors(kind: str, loaded: dict[str, Tensor], expected: dict[str, Tensor], named: str = "checkpoint") -> None:
    # ``named``: the checkpoint as errors name it (``load_path='runs/latest.pt'``).
    noun = "parameters" if kind == "params" else kind
    if loaded.keys() != expected.keys():
        missing = sorted(expected.keys() - loaded.keys())
        unexpected = sorted(loaded.keys() - expected.keys())
        other = " (a checkpoint of another model)" if len(missing) + len(unexpected) > len(expected) // 2 else ""
        raise ValueError(
            f"{named}: its {noun} do not match the model's{other}: {len(missing)} of the model's are not in it "
            f"({_listed(missing)}), and {len(unexpected)} of its are not the model's ({_listed(unexpected)})"
        )
    for name, tensor in loaded.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{named}: its {noun[:-1]} {name!r} has shape {tuple(tensor.shape)}; "
                f"the model expects {tuple(expected[name].shape)}"
            )


def _fit(leaves: Sequence[Any], expected: Sequence[Any]) -> bool:
    return len(leaves) == len(expected) and all(
        not isinstance(want, Tensor) or (isinstance(leaf, Tensor) and leaf.shape == want.shape)
        for leaf, want in zip(leaves, expected, strict=True)
    )


def _in_current_layouts(leaves: list[Any], template: Mapping[str, Any]) -> list[Any] | None:
    """Returns the leaves of ``template``'s entries (an algorithm's state each) with those a checkpoint saved in an
    earlier layout of their record read into its present one; None when an entry fits neither."""
    current: list[Any] = []
    taken = 0
    for entry in template.values():
        expected = pytree.tree_leaves(entry)
        if _fit(leaves[taken : taken + len(expected)], expected):
            current += leaves[taken : taken + len(expected)]
            taken += len(expected)
            continue
        earlier = from_earlier_layout(type(entry), leaves[taken:])
        if earlier is None:
            return None
        read, used = earlier
        current += pytree.tree_leaves(read)
        taken += used
    return current if taken == len(leaves) else None


def unflatten_tree(kind: str, leaves: list[Any], template: Any) -> Any:
    """Returns ``leaves`` (a checkpoint's flattened ``kind`` state) in the structure of ``template``.

    An entry of a mapping ``template`` (an algorithm's state) that the checkpoint holds in an earlier layout of its
    record is read into the present one. Raises ValueError, naming ``kind``, when the number of leaves or a tensor
    leaf's shape differs from the template's: a checkpoint saved with another optimizer or other algorithms.
    """
    expected, spec = pytree.tree_flatten(template)
    if isinstance(template, Mapping) and not _fit(leaves, expected):
        leaves = _in_current_layouts(leaves, template) or leaves
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


_REQUIRED = ("params", "buffers", "timestamp", "algorithms")
_RUN = ("opt", "algos", "algos_names", "hparams", "step", "key")


def read_checkpoint(
    path: str | os.PathLike[str], device: torch.device | str | None, *, argument: str = "load_path"
) -> dict[str, Any]:
    """Returns the payload of the checkpoint at ``path`` (plain values and tensors, read with ``weights_only``; a
    sharded checkpoint's folder is read whole, ``sharded_files.whole_payload``).

    A missing file is refused with FileNotFoundError; any file that is not a whole checkpoint of this package
    (empty, truncated, random bytes, text, another program's pickle) with one ValueError,
    ``{argument}='<path>' is not a checkpoint: <why>``.
    """
    if isinstance(path, str) and not path:
        raise ValueError(f"{argument}='': expected the path of a checkpoint file")
    if is_url(path):
        assert isinstance(path, str)
        path = resolved(path, argument=argument)
        if is_sharded_checkpoint(path):
            return whole_payload(path, device)
        with fetched_file(path, argument=argument) as copy:
            return _read_file(copy, device, argument, shown=path)
    path = local_path(path)
    source = Path(path)
    if is_sharded_checkpoint(source):
        return whole_payload(source, device)
    return _read_file(source, device, argument, shown=str(path))


def _read_file(source: Path, device: torch.device | str | None, argument: str, *, shown: str) -> dict[str, Any]:
    # The payload of the checkpoint file ``source`` (``shown`` in errors as the user gave it).
    path = shown
    if not source.is_file():
        what = "it is a folder" if source.is_dir() else "there is no such file"
        raise FileNotFoundError(f"{argument}={str(path)!r} is not a checkpoint file: {what}")
    if source.stat().st_size == 0:
        raise ValueError(f"{argument}={str(path)!r} is not a checkpoint: it is an empty file")
    try:
        payload = torch.load(source, map_location=device, weights_only=True)
    except MemoryError:
        raise
    except Exception as error:  # noqa: BLE001 -- the unpickler fails on foreign bytes with any error (IndexError, KeyError, ...)
        # A checkpoint is written whole or not at all (atomic rename): a file that does not read is not one. The
        # unpickler's own message would suggest loading without weights_only, which a checkpoint never needs.
        reason = type(error).__name__
        if not isinstance(error, pickle.UnpicklingError):
            reason += f": {first_line(error).split('. ')[0][:160]}"
        raise ValueError(
            f"{argument}={str(path)!r} is not a checkpoint: it cannot be read ({reason}); a truncated file or "
            "another kind of file"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        found = f"format {payload.get('format')!r}" if isinstance(payload, dict) else f"a {type(payload).__name__}"
        raise ValueError(
            f"{argument}={str(path)!r} is not a checkpoint: it holds {found}, not a composer_fn checkpoint of "
            f"format {FORMAT_VERSION}"
        )
    missing = [key for key in (*_REQUIRED, *(() if payload.get("weights_only") else _RUN)) if key not in payload]
    if missing:
        raise ValueError(f"{argument}={str(path)!r} is not a checkpoint: it lacks {', '.join(missing)}")
    return payload


def _facts(path: str | os.PathLike[str], argument: str) -> dict[str, Any]:
    # What a checkpoint says of its run: a sharded folder's facts, else the file's payload.
    where = path if is_url(path) else Path(local_path(path))
    return read_info(where) if is_sharded_checkpoint(where) else read_checkpoint(path, "cpu", argument=argument)


def checkpoint_metadata(path: str | os.PathLike[str], *, argument: str = "checkpoint") -> dict[str, Any]:
    """Returns the metadata stored with the checkpoint at ``path`` (a file or a sharded folder; empty if none was)."""
    metadata: dict[str, Any] = _facts(path, argument).get("metadata") or {}
    return metadata


def checkpoint_algorithms(path: str | os.PathLike[str], *, argument: str = "load_path") -> str:
    """Returns the JSON configs of the algorithms the checkpoint at ``path`` (a file or a sharded folder) was
    trained with."""
    algorithms: str = _facts(path, argument)["algorithms"]
    return algorithms


def recorded_algorithms(configs: str) -> tuple[Algorithm, ...]:
    """Returns the algorithms that ``configs`` (a checkpoint's JSON configs, ``algorithms_to_json``) names.

    A checkpoint may name any built-in algorithm, so the built-in ones are registered here, where names are read,
    rather than whenever the trainer is imported.
    """
    import composer_fn.algorithms  # noqa: F401

    return algorithms_from_json(configs)


def load_checkpoint(
    path: str | os.PathLike[str],
    template: State,
    *,
    device: torch.device | str | None = None,
    algorithms: str | None = None,
    argument: str = "load_path",
) -> Checkpoint:
    """Returns the checkpoint at ``path``, its pytrees rebuilt on the structure of ``template``.

    The file is read with ``torch.load(weights_only=True)``: it can hold tensors and plain values only.
    With ``algorithms`` (JSON configs), a checkpoint trained with other algorithms is refused first. ``argument``
    names the path in errors.
    """
    payload = read_checkpoint(path, device, argument=argument)
    if payload.get("weights_only", False):
        raise ValueError(
            f"{argument}={str(path)!r} holds weights only (saved with save_weights_only=True), not a run to resume: "
            "pass load_weights_only=True to start a run from its weights"
        )
    if algorithms is not None and payload["algorithms"] != algorithms:
        raise ValueError(
            f"{argument}={str(path)!r} was trained with algorithms {payload['algorithms']}; "
            f"this trainer has {algorithms}"
        )
    named = f"{argument}={str(path)!r}"
    _check_tensors("params", payload["params"], dict(template.params), named)
    _check_tensors("buffers", payload["buffers"], dict(template.buffers), named)
    if payload["algos_names"] != sorted(template.algos):
        raise ValueError(
            f"checkpoint holds state for algorithms {payload['algos_names']}; "
            f"this trainer has {sorted(template.algos)}"
        )
    state = State(
        params=payload["params"],
        buffers=payload["buffers"],
        opt=unflatten_tree("optimizer", payload["opt"], template.opt),
        algos=unflatten_tree("algorithm", payload["algos"], template.algos),
        hparams=payload["hparams"],
        step=payload["step"],
        key=payload["key"],
    )
    timestamp = Timestamp.from_dict(payload["timestamp"])
    return Checkpoint(state, timestamp, payload["algorithms"], payload.get("max_duration"))


def load_weights(
    path: str | os.PathLike[str],
    template: State,
    *,
    device: torch.device | str | None = None,
    strict: bool = True,
    ignore_keys: Sequence[str] = (),
    argument: str = "load_path",
) -> State:
    """Returns ``template`` with its parameters and buffers replaced by the checkpoint's, to start a new run.

    Everything else (optimizer and algorithm state, step, key) stays the template's, so the new run may use
    another optimizer or other algorithms. Names matching a pattern of ``ignore_keys`` (``fnmatch``, e.g.
    ``'head.*'``) are not loaded; a pattern that matches no name of the checkpoint or the model is refused. With
    ``strict``, every other name must be in both the checkpoint and the model; without it, names in one only are
    skipped. A name in both must have the same shape. A load that takes no parameter at all (a checkpoint of
    another model) is refused: the run would start from scratch. Loaded tensors take the template's dtype,
    device and memory layout. ``argument`` names the path in errors.
    """
    payload = read_checkpoint(path, device, argument=argument)
    names = [*payload["params"], *payload["buffers"], *template.params, *template.buffers]
    for pattern in ignore_keys:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ValueError(
                f"load_ignore_keys has the pattern {pattern!r}, which matches no name of {argument}={str(path)!r} or "
                f"of the model; the checkpoint's parameters are {_listed(payload['params'])}"
            )
    merged = {}
    for kind in ("params", "buffers"):
        expected: dict[str, Tensor] = dict(getattr(template, kind))
        loaded = {name: tensor for name, tensor in payload[kind].items() if not _ignored(name, ignore_keys)}
        wanted = {name: tensor for name, tensor in expected.items() if not _ignored(name, ignore_keys)}
        if strict:
            _check_tensors(kind, loaded, wanted, f"{argument}={str(path)!r}")
        shared = {name: tensor for name, tensor in loaded.items() if name in wanted}
        _check_tensors(kind, shared, {name: wanted[name] for name in shared}, f"{argument}={str(path)!r}")
        # Loaded tensors take the run's dtype, device and memory layout (weights saved by a ChannelsLast run
        # start a contiguous one contiguous): its optimizer state was laid out like its own parameters.
        converted = {name: t.to(dtype=expected[name].dtype, device=expected[name].device) for name, t in shared.items()}
        merged[kind] = {**expected, **in_layout_of(converted, expected)}
        if kind == "params" and not shared and expected:
            raise ValueError(
                f"{argument}={str(path)!r} has no parameter the model has "
                + ("once load_ignore_keys are left out " if ignore_keys else "")
                + f"(checkpoint: {_listed(payload['params'])}; model: {_listed(expected)}): nothing would load and "
                "the run would start from scratch; expected a checkpoint of this model"
            )
    return template.replace(params=merged["params"], buffers=merged["buffers"])


def _listed(names: Iterable[str], most: int = 6) -> str:
    names = list(names)
    shown = ", ".join(names[:most])
    return f"{shown}, ... ({len(names)} in all)" if len(names) > most else shown or "none"


def _ignored(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def with_recorded_surgeries(
    given: tuple[Algorithm, ...], load_path: str | Path, *, argument: str = "load_path"
) -> tuple[Algorithm, ...]:
    """Returns the algorithms to build a trainer with that resumes from ``load_path``.

    A checkpoint of a rewritten model holds the rewritten structure's tensors: a trainer given only the plain
    model (and no other algorithms) re-applies the recorded surgeries, in their order, before loading.
    """
    recorded = recorded_algorithms(checkpoint_algorithms(load_path, argument=argument))
    missing = [a for a in recorded if a not in given]
    rewrites = all(a.capabilities().rewrites is not None for a in missing)
    if missing and rewrites and all(a in recorded for a in given):
        return recorded
    return given


def autoresume_path(save_folder: SaveFolder | None, load_path: str | Path | None) -> str | Path | None:
    """Returns the newest checkpoint of ``save_folder`` (removing what interrupted writes left first), else
    ``load_path``."""
    assert save_folder is not None
    if isinstance(save_folder, ObjectFolder) or save_folder.is_dir():
        remove_stale_temporaries(save_folder)
    newest = newest_checkpoint(save_folder)
    return newest if newest is not None else load_path


def prepare_folder(folder: SaveFolder, argument: str, main: bool) -> None:
    """Makes ``folder`` ready for checkpoints: created when missing, and, on the main process (``main``), rid of the
    temporary files an interrupted write left; a file there, or a folder that cannot be created, is refused naming
    ``argument``. A bucket's folder was checked when opened (``save_folder_of``)."""
    if isinstance(folder, ObjectFolder):
        if main:
            remove_stale_temporaries(folder)
        return
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{argument}={str(folder)!r} is a file; expected a folder (created if missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"{argument}={str(folder)!r} cannot be created ({error.strerror or error}); expected a folder that can be "
            "written"
        ) from None
    if main:
        remove_stale_temporaries(folder)


def save_to_folder(
    folder: Path,
    state: State,
    timestamp: Timestamp,
    algorithms: str,
    *,
    weights_only: bool = False,
    metadata: dict[str, Any] | None = None,
    keep: int = -1,
) -> Path:
    """Returns the checkpoint written into ``folder`` (``checkpoint_name(timestamp)``, atomically), after pointing
    ``latest.pt`` at it (a symbolic link replaced atomically) and keeping the newest ``keep`` checkpoints (-1: all).
    ``algorithms``, ``weights_only`` and ``metadata`` are ``save_checkpoint``'s."""
    path = save_checkpoint(
        folder / checkpoint_name(timestamp), state, timestamp, algorithms, weights_only=weights_only, metadata=metadata
    )
    latest = folder / "latest.pt"
    link = folder / ".latest.pt.tmp"
    link.unlink(missing_ok=True)
    link.symlink_to(path.name)
    link.replace(latest)
    prune_checkpoints(folder, keep)
    return path


def resume_run(
    path: str | Path,
    state: State,
    timestamp: Timestamp,
    *,
    device: torch.device,
    algorithms: str,
    weights_only: bool = False,
    strict: bool = True,
    ignore_keys: Sequence[str] = (),
    argument: str = "load_path",
    max_duration: str = "",
    max_steps: int | None = None,
    shards: Shards | None = None,
) -> tuple[State, Timestamp]:
    """Returns the state and timestamp a run starts from at ``path``: the whole run, or with ``weights_only`` its
    parameters and buffers in ``state`` at ``timestamp`` (``load_weights`` with ``strict`` and ``ignore_keys``).

    ``state`` is the run's template (its structure and devices), ``algorithms`` its configs (``algorithms_to_json``). A whole run
    saved with another length (``timestamp.max_duration``; ``max_duration`` says it as the user wrote it) warns
    that the schedule's length changed; one already at ``max_steps`` warns that nothing will be trained.
    ``argument`` names where the path came from in errors and warnings. A sharded run reads a checkpoint into its
    own shards by ``shards``: a sharded checkpoint's folder with the processes' shards regrouped for it, a file
    whole and then cut (its weights whole: strict, nothing ignored).
    """
    if shards is not None and weights_only and (not strict or ignore_keys):
        raise ValueError(
            f"{argument}={str(path)!r}: a sharded run loads a checkpoint's weights whole (load_strict_model_weights="
            "True, no load_ignore_keys)"
        )
    if shards is not None and is_sharded_checkpoint(path):
        checkpoint = load_sharded_checkpoint(
            path, state, shards.read, algorithms=None if weights_only else algorithms, weights_only=weights_only,
            argument=argument,
        )  # fmt: skip
        if weights_only:
            return checkpoint.state, timestamp
    elif shards is not None:
        whole = shards.whole(state)
        if weights_only:
            weights = load_weights(path, whole, device="cpu", argument=argument)
            return shards.place(weights, state, True), timestamp
        checkpoint = load_checkpoint(path, whole, device="cpu", algorithms=algorithms, argument=argument)
        checkpoint = dataclasses.replace(checkpoint, state=shards.place(checkpoint.state, state, False))
    elif weights_only:
        weights = load_weights(path, state, device=device, strict=strict, ignore_keys=ignore_keys, argument=argument)
        return weights, timestamp
    else:
        checkpoint = load_checkpoint(path, state, device=device, algorithms=algorithms, argument=argument)
    length = timestamp.max_duration
    if checkpoint.max_duration is not None and length is not None and checkpoint.max_duration != str(length):
        warnings.warn(
            f"{argument}={str(path)!r} was saved by a run of {checkpoint.max_duration}; this run has "
            f"max_duration={max_duration} ({length}): the schedule's length changed, so schedules and "
            "warm-ups measured in fractions of the run continue on the new length",
            stacklevel=4,
        )
    resumed = checkpoint.timestamp.with_max_duration(length)
    if max_steps is not None and resumed.batch >= max_steps:
        warnings.warn(
            f"{argument}={str(path)!r} holds a run at batch {resumed.batch}, which max_duration="
            f"{max_duration} ({max_steps} batches) has already reached: fit() will train nothing",
            stacklevel=4,
        )
    return checkpoint.state, resumed


ShardReader = Callable[[str | os.PathLike[str], State, bool], State]
"""Reads a sharded checkpoint's folder into a run: ``(folder, template state, weights_only) -> state``."""


class Shards(Protocol):
    """How a sharded run reads a checkpoint into its own shards (``sharding.RunShards``)."""

    def read(self, folder: str | os.PathLike[str], template: State, weights_only: bool) -> State:
        """Returns the state of a sharded checkpoint's ``folder``, read into the run's shards."""

    def whole(self, template: State) -> State:
        """Returns ``template`` with whole shapes where the run holds shards (on the meta device): what a checkpoint
        file holds."""

    def place(self, whole: State, template: State, weights_only: bool) -> State:
        """Returns the run's state holding each process's part of ``whole``'s tensors (written into its own)."""


def save_sharded_to_folder(
    folder: Path,
    state: State,
    timestamp: Timestamp,
    algorithms: str,
    *,
    write: Callable[[Path], None],
    main: bool,
    barrier: Callable[[], None],
    weights_only: bool = False,
    metadata: dict[str, Any] | None = None,
    keep: int = -1,
    name: str | None = None,
) -> Path:
    """Returns the sharded checkpoint written into ``folder`` (``checkpoint_name(timestamp, sharded=True)``): every
    process calls it, and ``write(path)`` writes its shards (``sharded_files.write_shards``) into a temporary folder,
    which the main process (``main``) completes with the run's facts and renames; then it points ``latest`` at it and
    keeps the newest ``keep`` checkpoints (-1: all). A folder of the checkpoint's name is always complete; a write
    killed midway leaves a temporary one, which ``remove_stale_temporaries`` deletes. With ``name``, the folder
    has that name, and neither ``latest`` nor the other checkpoints change."""
    own_name = name is not None
    name = name if name is not None else checkpoint_name(timestamp, sharded=True)
    temporary, final = folder / f".{name}.tmp", folder / name
    if main:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temporary, ignore_errors=True)
    barrier()
    write(temporary)
    if main:
        write_info(temporary, _sharded_info(state, timestamp, algorithms, weights_only, metadata))
        sync_folder(temporary)
        if final.exists():  # saved at this batch before: the new one replaces it
            shutil.rmtree(final)
        os.replace(temporary, final)
        sync_folder(folder)
    if main and not own_name:
        link = folder / ".latest.tmp"
        link.unlink(missing_ok=True)
        link.symlink_to(name)
        link.replace(folder / "latest")
        prune_checkpoints(folder, keep)
    barrier()
    return final


def _sharded_info(
    state: State, timestamp: Timestamp, algorithms: str, weights_only: bool, metadata: dict[str, Any] | None
) -> dict[str, Any]:
    # The run's facts a sharded checkpoint holds beside its shards (``sharded_files.INFO``).
    return {
        "format": FORMAT_VERSION,
        "weights_only": weights_only,
        "timestamp": timestamp.to_dict(),
        "max_duration": None if timestamp.max_duration is None else str(timestamp.max_duration),
        "algorithms": algorithms,
        "algos_names": sorted(state.algos),
        "metadata": dict(metadata or {}),
    }


def save_to_bucket(
    folder: ObjectFolder,
    state: State,
    timestamp: Timestamp,
    algorithms: str,
    *,
    main: bool,
    barrier: Callable[[], None],
    shards: Callable[[bool], dict[str, Any]] | None = None,
    name: str | None = None,
    weights_only: bool = False,
    metadata: dict[str, Any] | None = None,
    keep: int = -1,
) -> str:
    """Returns the URL of the checkpoint of a run written into the bucket ``folder``, every process calling it (the
    arguments are ``save_run``'s). A checkpoint file is written locally by the main process and uploaded whole
    (visible once all its bytes are in); a sharded one is written there by every process, and counts once the main
    process has written the run's facts into it, last. Then, unless it has its own ``name``, ``latest`` names it and
    the newest ``keep`` are kept."""
    final = name if name is not None else checkpoint_name(timestamp, sharded=shards is not None)
    if shards is not None:
        if main:
            folder.remove(final)  # written at this batch before, or left by a killed write: replaced
        barrier()
        write_shards(folder.path(final), shards(weights_only))
        if main:
            write_info(folder.path(final), _sharded_info(state, timestamp, algorithms, weights_only, metadata))
    elif main:
        with tempfile.TemporaryDirectory(prefix="composer_fn-") as scratch:
            local = save_checkpoint(
                Path(scratch) / final, state, timestamp, algorithms, weights_only=weights_only, metadata=metadata
            )
            folder.put(local, final)
    if main and name is None:
        folder.write_text(LATEST, final)
        prune_checkpoints(folder, keep)
    barrier()
    return folder.path(final)


def load_sharded_checkpoint(
    path: str | os.PathLike[str],
    template: State,
    read: ShardReader,
    *,
    algorithms: str | None = None,
    weights_only: bool = False,
    argument: str = "load_path",
) -> Checkpoint:
    """Returns the sharded checkpoint in the folder ``path``, read by ``read`` into ``template``'s structure (a run
    of any number of processes: the shards are regrouped for it). With ``algorithms`` (JSON configs), a checkpoint
    trained with other algorithms is refused first; without ``weights_only``, one that holds weights only."""
    folder = path if is_url(path) else Path(local_path(path))
    info = read_info(folder)
    if info.get("format") != FORMAT_VERSION:
        raise ValueError(f"{argument}={str(path)!r} is not a checkpoint of format {FORMAT_VERSION}")
    if info["weights_only"] and not weights_only:
        raise ValueError(
            f"{argument}={str(path)!r} holds weights only (saved with save_weights_only=True), not a run to resume: "
            "pass load_weights_only=True to start a run from its weights"
        )
    if algorithms is not None and info["algorithms"] != algorithms:
        raise ValueError(f"{argument}={str(path)!r} was trained with algorithms {info['algorithms']}; this trainer has {algorithms}")
    if not weights_only and info["algos_names"] != sorted(template.algos):
        raise ValueError(
            f"checkpoint holds state for algorithms {info['algos_names']}; this trainer has {sorted(template.algos)}"
        )
    state = read(folder, template, weights_only)
    return Checkpoint(state, Timestamp.from_dict(info["timestamp"]), info["algorithms"], info.get("max_duration"))


def save_run(
    folder: SaveFolder,
    state: State,
    timestamp: Timestamp,
    algorithms: str,
    *,
    main: bool,
    barrier: Callable[[], None],
    shards: Callable[[bool], dict[str, Any]] | None = None,
    name: str | None = None,
    weights_only: bool = False,
    metadata: dict[str, Any] | None = None,
    keep: int = -1,
) -> Path | str:
    """Returns the checkpoint of a run written into ``folder``, every process calling it: named ``name`` (and then
    neither ``latest`` nor the other checkpoints change), else ``checkpoint_name(timestamp)`` as ``save_to_folder``
    does. A sharded run's (``shards(weights_only)`` gives this process's tree: ``sharding.shards_tree``) is a folder
    each process writes its shards into (``save_sharded_to_folder``); any other is the main process's file, while
    the others wait. A folder in a bucket gets them by ``save_to_bucket`` (and the URL is returned)."""
    if isinstance(folder, ObjectFolder):
        return save_to_bucket(
            folder, state, timestamp, algorithms, main=main, barrier=barrier, shards=shards, name=name,
            weights_only=weights_only, metadata=metadata, keep=keep,
        )  # fmt: skip
    if shards is not None:
        return save_sharded_to_folder(
            folder, state, timestamp, algorithms, write=lambda path: write_shards(path, shards(weights_only)), main=main,
            barrier=barrier, weights_only=weights_only, metadata=metadata, keep=keep, name=name,
        )  # fmt: skip
    path = folder / (name if name is not None else checkpoint_name(timestamp))
    if main and name is None:
        save_to_folder(folder, state, timestamp, algorithms, weights_only=weights_only, metadata=metadata, keep=keep)
    elif main:
        save_checkpoint(path, state, timestamp, algorithms, weights_only=weights_only, metadata=metadata)
    barrier()
    return path
