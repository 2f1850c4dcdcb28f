"""Hypothesis profiles: derandomized in CI (set the CI environment variable), seeded afresh locally; the longest
test files collected first."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from hypothesis import settings

# Tests run small tensors, where a second intra-op thread costs more than it gives, and CI machines are shared.
torch.set_num_threads(1)

settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=50)
settings.register_profile("dev", deadline=None, database=None, max_examples=50, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


# pytest-xdist (--dist loadfile) hands whole files to its processes in collection order. Collected in path order, the
# longest files (compiled steps, launched process groups) came last, and one process ran the last of them alone
# while the other had finished; collected first, the short files fill the end for both.
LONGEST_FIRST = (
    "trainer/test_differential.py",
    "distributed/test_world_size.py",
    "algorithms/test_contract.py",
    "distributed/test_sharding.py",
    "distributed/test_launch.py",
    "docs/test_guide.py",
    "distributed/test_runs.py",
    "test_pareto.py",
    "algorithms/test_progressive_resizing.py",
    "algorithms/test_augmix.py",
    "algorithms/test_seq_length_warmup.py",
)


def pytest_collection_modifyitems(session: object, config: object, items: list) -> None:  # type: ignore[type-arg]
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    here = Path(__file__).resolve().parent

    def place(item: object) -> int:
        path = Path(str(getattr(item, "path", ""))).resolve()
        try:
            return rank.get(path.relative_to(here).as_posix(), len(rank))
        except ValueError:
            return len(rank)

    items.sort(key=place)  # stable: the other files, and the tests within each file, keep their order
