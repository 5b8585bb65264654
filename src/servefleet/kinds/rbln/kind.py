"""RBLN recipe cards, served on RBLN NPU hosts (the ``rbln`` platform,
:mod:`servefleet.platforms.rbln`).

Recipes: docs.rbln.ai's JSON cards, bare or inside the page text, named ``rbln/<name>``. A host
serves a card when its NPUs are a SKU the card is verified on; a release takes the extras of
``vllm-rbln`` the selection needs. Its data defaults (its platform's SDK, indexes and driver
with them): :mod:`.defaults`; its own keys: the selection's (``serve_target``,
``serve_selection``, ``serve_recommended``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.base import Hardware, Kind, ResolveOption, Wants
from servefleet.kinds.loader import load_json, load_yaml
from servefleet.kinds.rbln import defaults as rbln_defaults
from servefleet.kinds.rbln.card import Card, load_card
from servefleet.kinds.rbln.resolve import (
    default_selection,
    pick_option,
    pick_strategy,
    resolve_rbln,
)
from servefleet.kinds.roles import deployable
from servefleet.spec import ServeSpec


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


class Rbln(Kind):
    kind = "rbln"
    label = "an RBLN recipe card"
    title = "RBLN"
    options = (
        ResolveOption("--target", "target", "Latency (default) or Throughput, any case."),
        ResolveOption("--set", "sets", "choose a value.", metavar="AXIS=VALUE", multiple=True),
        ResolveOption(
            "--recommended", "recommended", "start from the recommended values.", is_flag=True
        ),
        ResolveOption("--sku", "sku", "NPU SKU (default: the option's first)."),
        ResolveOption(
            "--compiler-version",
            "compiler_version",
            "rebel-compiler version for the fingerprint (default: the data's pin).",
            metavar="X.Y.Z",
        ),
    )
    platforms = ("rbln",)
    defaults = rbln_defaults.DEFAULTS
    keys = frozenset({"serve_target", "serve_selection", "serve_recommended"})

    # -- recipes

    def detect(self, path: Path, text: str) -> bool:
        start = text.find("{")
        if start >= 0:
            try:
                if is_card(load_json(text, str(path), start)[0]):
                    return True
            except RecipeError:
                pass
        try:
            return is_card(load_yaml(text, str(path)))
        except RecipeError:
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

    # -- hosts

    def resolve_data(self, settings: Wants, sku: str | None = None) -> ServeSpec:
        card = load_card(self.path_of(settings.serve_recipe), name=settings.serve_recipe)
        spec = resolve_rbln(
            card,
            target=settings.serve_target,
            strategy=settings.serve_strategy,
            sets=settings.serve_selection,
            recommended=settings.serve_recommended,
            sku=sku,
            compiler_version=settings.sdk_pins["rebel-compiler"],
        )
        one = [s.slug for s in card.strategies if all(len(o.grid.base) == 1 for o in s.options)]
        allowed = f"serve_strategy of one role: {', '.join(one)}" if one else "a card of one role"
        return deployable(spec, allowed)

    def refusal(self, settings: Wants, spec: ServeSpec, hardware: Hardware) -> str | None:
        if not hardware.devices:
            return (
                f"no RBLN NPU found (by {hardware.source}); "
                f"the recipe needs one of {', '.join(spec.skus)}"
            )
        if hardware.sku not in spec.skus:
            found = ", ".join(sorted(set(hardware.skus)))
            return (
                f"host SKU {found} is not one {spec.recipe} is verified on ({', '.join(spec.skus)})"
            )
        return None

    def release_extras(self, spec: ServeSpec) -> list[str]:
        return list(spec.requirements.vllm_rbln_extras)

    def unit_data(self, options: Mapping[str, Any], data: dict[str, Any]) -> None:
        version = options.get("compiler_version")
        if version:  # the fingerprint's compiler is the pinned one
            data["sdk_pins"] = [
                f"rebel-compiler=={version}" if p.startswith("rebel-compiler==") else p
                for p in data["sdk_pins"]
            ]


KIND = Rbln()
