"""Shared cases for the RBLN tests: the seed card, the fixture cards, every combination."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

from servefleet.base.shipped import FILES
from servefleet.kinds.rbln.card import Card, load_card

REPO = Path(__file__).resolve().parents[2]
SEED = FILES / "recipes" / "rbln" / "gpt-oss-120b.json"
SEED_PAGE = REPO / "tests" / "data" / "rbln" / "gpt-oss-120b.page.txt"
DATA = REPO / "tests" / "data"
TINY = DATA / "rbln" / "tiny-moe.json"
BROKEN = DATA / "rbln" / "broken"
COMPILER = "0.12.0"


def seed() -> Card:
    return load_card(SEED, name="rbln/gpt-oss-120b")


def combinations(card: Card) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(strategy, target, full selection) for every modes x options value of every option."""
    for strategy in card.strategies:
        for opt in strategy.options:
            offered = opt.grid.offered()
            for values in itertools.product(*offered.values()):
                yield strategy.slug, opt.target, dict(zip(offered, values, strict=True))
