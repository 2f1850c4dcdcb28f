"""Sharded checkpoints on disk: ``torch.distributed.checkpoint`` (DCP) folders.

A sharded checkpoint is a folder: each process writes its own shards of the state into it (DCP's ``.distcp`` files)
and DCP writes its index (``.metadata``) once every process has written; the run's facts (timestamp, algorithms,
metadata) are in ``composer_fn.json``, written last. Whatever reads one gets whole tensors or the shards it asks
for, at any number of processes: DCP reshards on load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["INFO", "is_sharded_checkpoint", "write_shards", "read_shards", "write_info", "read_info"]

INFO = "composer_fn.json"
"""The file in a sharded checkpoint's folder that holds the run's facts (and marks the folder complete)."""


def is_sharded_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Returns whether ``path`` is a complete sharded checkpoint: a folder with DCP's index and the run's facts."""
    folder = Path(path)
    return folder.is_dir() and (folder / ".metadata").is_file() and (folder / INFO).is_file()


def write_shards(folder: Path, tree: dict[str, Any]) -> None:
    """Writes ``tree`` (nested dicts of tensors: DTensors are written shard by shard, each by its process; a plain
    tensor once) into ``folder`` by DCP; every process of the group calls it."""
    import torch.distributed.checkpoint as dcp

    dcp.save(tree, checkpoint_id=str(folder))


def read_shards(folder: Path, tree: dict[str, Any], grouped: bool) -> None:
    """Reads the checkpoint in ``folder`` into ``tree``'s tensors, in place (a DTensor receives its shards, a plain
    tensor the whole); with ``grouped`` every process of the group calls it, else this process reads alone."""
    import torch.distributed.checkpoint as dcp

    dcp.load(tree, checkpoint_id=str(folder), no_dist=not grouped)


def write_info(folder: Path, info: dict[str, Any]) -> None:
    """Writes the run's facts into ``folder`` (flushed to disk)."""
    with open(folder / INFO, "w", encoding="utf-8") as stream:
        json.dump(info, stream)
        stream.flush()
        os.fsync(stream.fileno())


def read_info(folder: Path) -> dict[str, Any]:
    """Returns the run's facts of the sharded checkpoint in ``folder``."""
    info: dict[str, Any] = json.loads((folder / INFO).read_text(encoding="utf-8"))
    return info
