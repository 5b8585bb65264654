"""What a vLLM recipe offers, for ``servefleet recipes show``."""

from __future__ import annotations

from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.vllm.hardware import offered_hardware, single_node_strategies, variant_runs
from servefleet.kinds.vllm.kv_offload import kv_offload_offered
from servefleet.kinds.vllm.pd import is_pd, pool_modes
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.kinds.vllm.resolve import resolve_vllm

_PROFILE_KEYS = ("display_name", "description", "brand", "generation", "gpu_count", "vram_gb")
_STRATEGY_KEYS = (
    "display_name",
    "short_label",
    "deploy_type",
    "orientation",
    "description",
    "parallel_flag",
    "parallelism",
)
_KV_KEYS = ("display_name", "label", "description", "group", "order", "docs_url", "install")


def _pick(mapping: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: mapping[k] for k in keys if mapping.get(k) is not None}


def _platforms(entries: list[Any], known: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``meta.platforms`` against ``platforms.yaml``, as the site resolves them: a bare id is the
    catalog entry, an object ``{id, ...}`` overrides its fields; unknown ids are dropped."""
    out = []
    for entry in entries:
        pid = entry if isinstance(entry, str) else entry.get("id")
        if pid in known:
            out.append(known[pid] if isinstance(entry, str) else {**known[pid], **entry})
    return out


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
        if f.get("label"):
            feats[name]["label"] = f["label"]
        if f.get("strategies"):
            feats[name]["strategies"] = list(f["strategies"])
        opt_in_here = [
            g for g in offered if name in r.opt_in_on(g) and name not in r.opt_in_features
        ]
        if opt_in_here:
            feats[name]["opt_in_on"] = opt_in_here
        if (f.get("companion") or {}).get("command"):
            feats[name]["companion"] = f["companion"].get("label") or name
    variants = {}
    for name, v in r.variants.items():
        variants[name] = {
            "model_id": str(v.get("model_id") or r.model_id),
            "precision": v.get("precision"),
            "vram_minimum_gb": v.get("vram_minimum_gb"),
            "hardware": [g for g in offered if variant_runs(r, name, g)],
        }
        if v.get("default_modes"):
            variants[name]["forces_features"] = [f for f in v["default_modes"] if f in r.features]
        for key in ("label", "description", "min_vllm_version", "nightly_required"):
            if v.get(key) is not None:
                variants[name][key] = v[key]
    try:
        spec = resolve_vllm(r)
        recommended: dict[str, Any] = dict(spec.selection)
    except RecipeError as e:
        recommended = {"error": str(e)}
    model = r.data["model"]
    declared = r.declared_hardware
    hardware_details = {
        g: {**_pick(r.profiles[g], _PROFILE_KEYS), "status": declared.get(g)} for g in offered
    }
    strategy_details = {
        s: {
            **_pick(r.strategies[s], _STRATEGY_KEYS),
            "hardware_match": dict(r.strategies[s].get("hardware_match") or {}),
        }
        for s in r.compatible_strategies
    }
    for s in r.compatible_strategies:
        if is_pd(r, s):  # --pool-parallelism: what its prefill and decode pools may take
            strategy_details[s]["pool_parallelism"] = pool_modes(r)
    rec_hw = recommended.get("hardware")
    rec_strategy = recommended.get("strategy") or None
    kv = {
        k: {
            **_pick(o, _KV_KEYS),
            "strategies": list(o.get("strategies") or []),
            "brands": list(o.get("brands") or []),
            "requires_opt_in": bool(o.get("requires_opt_in")),
            "support": (r.data.get("kv_offload_support") or {}).get(k),
        }
        for k, o in r.kv_offload_options.items()
    }
    known = {str(p.get("id")): p for p in r.platforms}
    info: dict[str, Any] = {
        "recipe": r.name,
        "kind": "vllm",
        "form": r.form,
        "model": r.model_id,
        "title": r.meta.get("title"),
        "tasks": r.tasks,
        "omni": r.is_omni,
        "hardware": offered,
        "hardware_details": hardware_details,
        "strategies": r.compatible_strategies,
        "strategy_details": strategy_details,
        "single_node_strategies": {g: single_node_strategies(r, g) for g in offered},
        "variants": variants,
        "features": feats,
        "kv_offload": kv,
        "kv_offload_groups": dict(r.taxonomy.get("kv_offload_groups") or {}),
        "kv_offload_here": (
            kv_offload_offered(r, rec_hw, rec_strategy) if rec_hw in r.profiles else []
        ),
        "recommended": recommended,
        "min_vllm_version": model.get("min_vllm_version"),
        "docker_image": model.get("docker_image"),
        "dependencies": list(r.data.get("dependencies") or []),
        "platforms": _platforms(r.meta.get("platforms") or [], known),
    }
    if r.is_omni:
        info["omni_tasks"] = {
            k: {
                kk: t[kk]
                for kk in ("id", "label", "description", "model_id", "endpoint", "vram_minimum_gb")
                if t.get(kk) is not None
            }
            for k, t in r.omni_tasks.items()
        }
    return info
