"""Hypothesis profiles: derandomized in CI (set the CI environment variable), seeded afresh locally."""

from __future__ import annotations

import os

import torch
from hypothesis import settings

# Tests run small tensors, where a second intra-op thread costs more than it gives, and CI machines are shared.
torch.set_num_threads(1)

settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=50)
settings.register_profile("dev", deadline=None, database=None, max_examples=50, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
