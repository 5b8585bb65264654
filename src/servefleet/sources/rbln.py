"""RBLN recipe cards (docs.rbln.ai's JSON, bare or inside the page text): ``rbln/<name>``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from servefleet.errors import RecipeError
from servefleet.recipes import Card, load_card
from servefleet.resolve import default_selection, pick_option, pick_strategy, resolve_rbln
from servefleet.sources.base import Source
from servefleet.spec import ServeSpec

if TYPE_CHECKING:
    pass


def is_card(obj: Any) -> bool:
    """An RBLN card has ``strategies`` whose options carry a ``grid``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("strategies"), list):
        return False
    for s in obj["strategies"]:
        if isinstance(s, dict) and isinstance(s.get("options"), list):
            if any(isinstance(o, dict) and "grid" in o for o in s["options"]):
                return True
    return False


def describe(card: Card) -> dict[str, Any]:
    """What a card offers, per strategy and target: axes, defaults, recommended, excluded."""
    return {
        "recipe": card.name,
        "kind": "rbln",
        "model": card.model,
        "display_axes": card.axes,
        "strategies": [
            {
                "slug": s.slug,
                "label": s.label,
                "targets": [
                    {
                        "target": o.target,
                        "npus": o.npus,
                        "skus": o.skus,
                        "axes": o.grid.offered(),
                        "defaults": default_selection(o.grid),
                        "recommended": default_selection(o.grid, recommended=True),
                        "excluded": o.grid.excluded,
                    }
                    for o in s.options
                ],
            }
            for s in card.strategies
        ],
    }


def parse_sets(
    sets: tuple[str, ...], card: Card, target: str, strategy: str | None
) -> dict[str, str]:
    """``AXIS=VALUE`` items of ``--set`` as a map; one that is not names what is offered."""
    out: dict[str, str] = {}
    for item in sets:
        axis, eq, value = item.partition("=")
        if not eq or not axis:
            grid = pick_option(card, pick_strategy(card, strategy), target).grid
            offered = "; ".join(f"{a}: {', '.join(v)}" for a, v in grid.offered().items())
            raise RecipeError(f"--set {item!r} is not AXIS=VALUE (offered: {offered})")
        out[axis] = value
    return out


class RblnSource(Source):
    kind = "rbln"
    label = "an RBLN recipe card"
    options = {
        "--target": "target",
        "--set": "sets",
        "--recommended": "recommended",
        "--sku": "sku",
        "--compiler-version": "compiler_version",
    }

    def detect(self, path: Path, text: str) -> bool:
        start = text.find("{")
        if start >= 0:
            try:
                if is_card(json.JSONDecoder().raw_decode(text, start)[0]):
                    return True
            except json.JSONDecodeError:
                pass
        try:
            return is_card(yaml.safe_load(text))
        except yaml.YAMLError:
            return False

    def locate(self, rest: str, base: Path) -> Path | None:
        path = base / "rbln" / f"{rest}.json"
        return path if path.is_file() else None

    def names(self, base: Path) -> list[str]:
        return [f"rbln/{p.stem}" for p in sorted((base / "rbln").glob("*.json"))]

    def show(self, path: Path, name: str) -> dict[str, Any]:
        return describe(load_card(path, name=name))

    def resolve(
        self, path: Path, name: str, strategy: str | None, options: Mapping[str, Any]
    ) -> ServeSpec:
        card = load_card(path, name=name)
        target = options.get("target") or "Latency"
        return resolve_rbln(
            card,
            target=target,
            strategy=strategy,
            sets=parse_sets(options.get("sets", ()), card, target, strategy),
            recommended=bool(options.get("recommended")),
            sku=options.get("sku"),
            compiler_version=options.get("compiler_version"),
        )


SOURCE = RblnSource()
