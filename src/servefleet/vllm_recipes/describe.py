"""What a vLLM recipe offers, for ``servefleet recipes show``."""

from __future__ import annotations

from typing import Any

from servefleet.errors import RecipeError
from servefleet.vllm_recipes.hardware import _variant_runs, offered_hardware, single_node_strategies
from servefleet.vllm_recipes.recipe import VllmRecipe
from servefleet.vllm_recipes.resolve import resolve_vllm


def describe_vllm(recipe: VllmRecipe) -> dict[str, Any]:
    """What a recipe offers, for ``servefleet recipes show``.

    + recipe: a loaded recipe
    """
    r = recipe
    offered = offered_hardware(r)
    feats: dict[str, Any] = {}
    for name, f in r.features.items():
        modes = f.get("modes") if isinstance(f.get("modes"), dict) else None
        feats[name] = {
            "description": str(f.get("description") or ""),
            "opt_in": name in r.opt_in_features,
            "modes": list(modes or {}),
            "default_mode": f.get("default_mode") if modes else None,
        }
    variants = {
        name: {
            "model_id": str(v.get("model_id") or r.model_id),
            "precision": v.get("precision"),
            "vram_minimum_gb": v.get("vram_minimum_gb"),
            "hardware": [g for g in offered if _variant_runs(r, name, g)],
        }
        for name, v in r.variants.items()
    }
    try:
        spec = resolve_vllm(r)
        recommended: dict[str, Any] = dict(spec.selection)
    except RecipeError as e:
        recommended = {"error": str(e)}
    return {
        "recipe": r.name,
        "kind": "vllm",
        "form": r.form,
        "model": r.model_id,
        "hardware": offered,
        "strategies": r.compatible_strategies,
        "single_node_strategies": {g: single_node_strategies(r, g) for g in offered},
        "variants": variants,
        "features": feats,
        "recommended": recommended,
    }
