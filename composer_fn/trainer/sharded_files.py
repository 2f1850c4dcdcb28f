"""Sharded checkpoints on disk: ``torch.distributed.checkpoint`` (DCP) folders.

A sharded checkpoint is a folder: each process writes its own shards of the state into it (DCP's ``.distcp`` files)
and DCP writes its index (``.metadata``) once every process has written; the run's facts (timestamp, algorithms,
metadata) are in ``composer_fn.json``, written last. Whatever reads one gets whole tensors or the shards it asks
for, at any number of processes: DCP reshards on load. A folder given as a URL (``object_store``) is written and
read by DCP's fsspec writer and reader, each process its own shards.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from composer_fn.trainer.object_store import ObjectFolder, is_url, storage_options

__all__ = ["INFO", "is_sharded_checkpoint", "write_shards", "read_shards", "write_info", "read_info", "whole_payload"]

INFO = "composer_fn.json"
"""The file in a sharded checkpoint's folder that holds the run's facts (and marks the folder complete)."""


def is_sharded_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Returns whether ``path`` is a complete sharded checkpoint: a folder with DCP's index and the run's facts."""
    if is_url(path):
        folder = ObjectFolder(str(path), argument="checkpoint", check=False)
        return folder.exists(INFO) and folder.exists(".metadata")
    local = Path(path)
    return local.is_dir() and (local / ".metadata").is_file() and (local / INFO).is_file()


def _writer(folder: str | os.PathLike[str]) -> dict[str, Any]:
    if is_url(folder):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return {"storage_writer": FsspecWriter(str(folder), **storage_options(str(folder)))}
    return {"checkpoint_id": str(folder)}


def _reader(folder: str | os.PathLike[str]) -> Any:
    if is_url(folder):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(str(folder), **storage_options(str(folder)))
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(str(folder))


def write_shards(folder: str | os.PathLike[str], tree: dict[str, Any]) -> None:
    """Writes ``tree`` (nested dicts of tensors: DTensors are written shard by shard, each by its process; a plain
    tensor once) into ``folder`` (a path or a URL) by DCP; every process of the group calls it."""
    import torch.distributed.checkpoint as dcp

    dcp.save(tree, **_writer(folder))


def read_shards(folder: str | os.PathLike[str], tree: dict[str, Any], grouped: bool) -> None:
    """Reads the checkpoint in ``folder`` (a path or a URL) into ``tree``'s tensors, in place (a DTensor receives its
    shards, a plain tensor the whole); with ``grouped`` every process of the group calls it, else this process reads
    alone."""
    import torch.distributed.checkpoint as dcp

    dcp.load(tree, storage_reader=_reader(folder), no_dist=not grouped)


def write_info(folder: str | os.PathLike[str], info: dict[str, Any]) -> None:
    """Writes the run's facts into ``folder`` (flushed to disk; in a bucket, one put)."""
    if is_url(folder):
        ObjectFolder(str(folder), argument="save_folder", check=False).write_text(INFO, json.dumps(info))
        return
    with open(Path(folder) / INFO, "w", encoding="utf-8") as stream:
        json.dump(info, stream)
        stream.flush()
        os.fsync(stream.fileno())


def read_info(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Returns the run's facts of the sharded checkpoint in ``folder``."""
    if is_url(folder):
        text = ObjectFolder(str(folder), argument="load_path", check=False).read_text(INFO)
    else:
        text = (Path(folder) / INFO).read_text(encoding="utf-8")
    info: dict[str, Any] = json.loads(text)
    return info


def whole_payload(folder: str | os.PathLike[str], device: Any = None) -> dict[str, Any]:
    """Returns the sharded checkpoint in ``folder`` read whole by this process alone, laid out as a checkpoint file's
    payload (``checkpoint.read_checkpoint``): the run's facts, the parameters and buffers by name and, unless it holds
    weights only, the optimizer's and algorithms' leaves in order, the hyperparameters, the step and the key."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    stored = _reader(folder).read_metadata().state_dict_metadata
    tree: dict[str, Any] = {}
    for key, entry in stored.items():
        kind, _, name = key.partition(".")
        if isinstance(entry, TensorStorageMetadata):
            value: Any = torch.empty(entry.size, dtype=entry.properties.dtype)
        else:
            value = None  # a value that is not a tensor: read as it was written
        if name:
            tree.setdefault(kind, {})[name] = value
        else:
            tree[kind] = value
    read_shards(folder, tree, grouped=False)
    if device is not None:  # tensors moved; the values that are not (hyperparameters, counts, None) kept as read

        def moved(value: Any) -> Any:
            return value.to(device) if isinstance(value, torch.Tensor) else value

        tree = {
            kind: {n: moved(v) for n, v in entries.items()} if isinstance(entries, dict) else moved(entries)
            for kind, entries in tree.items()
        }
    payload = {**read_info(folder), "params": tree["params"], "buffers": tree.get("buffers", {})}
    if not payload["weights_only"]:
        for kind in ("opt", "algos"):
            entries = tree.get(kind, {})
            payload[kind] = [entries[str(i)] for i in range(len(entries))]
        payload.update(hparams=tree.get("hparams", {}), step=tree["step"], key=tree["key"])
    return payload
