"""Every registered algorithm has a method card with the sections every card has, and the index lists it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import composer_fn.algorithms  # noqa: F401 (fills the registry)
from composer_fn.core.algorithm import REGISTRY

CARDS = Path(__file__).resolve().parents[2] / "docs" / "algorithms"
SHARED_CARDS = {"early_stopper": "stopping", "threshold_stopper": "stopping"}
"""Algorithms described together on one card."""

SECTIONS = (
    "What it does",
    "When to use it",
    "Hyperparameters",
    "Events",
    "Differences from Composer",
    "Measured effect",
)
"""The sections every card has, in this order; a section whose heading starts with the name counts
("Events and ordering")."""


def card_of(name: str) -> Path:
    """Returns the card of the registered algorithm ``name``."""
    return CARDS / f"{SHARED_CARDS.get(name, name)}.md"


def cards() -> list[Path]:
    """Returns every method card (the index is not one)."""
    return sorted(page for page in CARDS.glob("*.md") if page.name != "index.md")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_algorithm_has_a_card(name: str) -> None:
    assert card_of(name).is_file(), f"{name} has no card at {card_of(name)}"


@pytest.mark.parametrize("card", cards(), ids=lambda page: page.stem)
def test_every_card_has_the_sections_of_a_card_in_order(card: Path) -> None:
    headings = re.findall(r"^## (.+?)\s*$", card.read_text(), flags=re.MULTILINE)
    positions = []
    for section in SECTIONS:
        found = [index for index, heading in enumerate(headings) if heading.startswith(section)]
        assert found, f"{card.name} has no '## {section}' section"
        positions.append(found[0])
    assert positions == sorted(positions), f"{card.name}: sections out of order: {headings}"


def test_every_card_is_on_the_index() -> None:
    index = (CARDS / "index.md").read_text()
    missing = [card.name for card in cards() if f"]({card.name})" not in index]
    assert not missing, missing
