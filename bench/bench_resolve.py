"""Benchmark (not a test): resolve all 108 combinations of the seed card in one process.

Run: ``.venv/bin/python bench/bench_resolve.py [ROUNDS]``. Prints the time per resolve and its
ratio to loading (reading + validating) the card once. No timed assertions anywhere.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

from servefleet.kinds.rbln.card import load_card
from servefleet.kinds.rbln.resolve import resolve_rbln

SEED = (
    Path(__file__).resolve().parents[1]
    / "src"
    / "servefleet"
    / "_files"
    / "recipes"
    / "rbln"
    / "gpt-oss-120b.json"
)


def main(rounds: int = 5) -> None:
    start = time.perf_counter()
    for _ in range(rounds):
        card = load_card(SEED, name="rbln/gpt-oss-120b")
    load_s = (time.perf_counter() - start) / rounds

    cases = []
    for strategy in card.strategies:
        for opt in strategy.options:
            offered = opt.grid.offered()
            for values in itertools.product(*offered.values()):
                cases.append((strategy.slug, opt.target, dict(zip(offered, values, strict=True))))

    start = time.perf_counter()
    for _ in range(rounds):
        for slug, target, sel in cases:
            resolve_rbln(card, strategy=slug, target=target, sets=sel, compiler_version="0.12.0")
    total = time.perf_counter() - start
    per = total / (rounds * len(cases))
    print(f"combinations: {len(cases)}  rounds: {rounds}")
    print(f"load card:   {load_s * 1e3:8.3f} ms")
    print(f"resolve:     {per * 1e3:8.3f} ms per combination ({total:.3f} s in all)")
    print(f"ratio:       {per / load_s:8.3f} x a card load per resolve")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
