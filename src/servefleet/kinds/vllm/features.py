"""Features of a vLLM recipe: which are on for a selection (and in which mode), and the
args/env each contributes."""

from __future__ import annotations

from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.base.vllm_args import env_map
from servefleet.kinds.vllm.hardware import generation, hardware_keys
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.kinds.vllm.words import Item, items


def parse_features(
    r: VllmRecipe, features: list[str], no_features: list[str]
) -> dict[str, str | None]:
    """The features asked for by name -> mode (None: no mode given); unknown names, an empty
    mode and a feature both on and off are errors.

    + r: the recipe
    + features: ``NAME`` or ``NAME=MODE``
    + no_features: names turned off
    """
    known = r.features
    names = ", ".join(known) or "none"
    wanted: dict[str, str | None] = {}
    for item in features:
        name, sep, mode = item.partition("=")
        if name not in known:
            raise RecipeError(f"{r.name}: unknown feature {name!r} (features: {names})")
        if sep and not mode:
            raise RecipeError(f"{r.name}: --feature {item!r} names no mode")
        wanted[name] = mode if sep else None
    for name in no_features:
        if name not in known:
            raise RecipeError(f"{r.name}: unknown feature {name!r} (features: {names})")
        if name in wanted:
            raise RecipeError(f"{r.name}: feature {name} is both turned on and off")
    return wanted


def _mode_allowed(mode: dict[str, Any], vname: str, gpu: str, prof: dict[str, Any]) -> bool:
    allow = mode.get("variants")
    if isinstance(allow, list) and allow and vname not in allow:
        return False
    hw = mode.get("hardware")
    if isinstance(hw, dict):
        if hw.get(generation(prof)) == "unsupported" or hw.get(gpu) == "unsupported":
            return False
    return True


def select_features(
    r: VllmRecipe,
    vname: str,
    strategy: str | None,
    gpu: str,
    features: list[str],
    no_features: list[str],
) -> dict[str, str | None]:
    """Enabled features (recipe order) -> selected mode (None for a plain feature).

    Without ``features`` / ``no_features`` these are the site's defaults
    (:meth:`VllmRecipe.default_features`: not opt-in on this GPU, or forced on by the variant's
    ``default_modes``); a name in ``features`` turns an opt-in one on, ``no_features`` any off.

    ``strategy`` is None for a recipe without strategies: a feature limited to some strategies
    (``strategies``) is then not offered."""
    wanted = parse_features(r, features, no_features)
    prof, variant = r.profiles[gpu], r.variants[vname]
    defaults = r.default_features(vname, gpu)
    on: dict[str, str | None] = {}
    for name, feat in r.features.items():
        explicit = name in wanted
        if name in no_features or (not explicit and name not in defaults):
            continue
        allow = feat.get("strategies")
        if isinstance(allow, list) and allow and strategy not in allow:
            if explicit:
                with_what = f"strategy {strategy}" if strategy else "a recipe without strategies"
                raise RecipeError(
                    f"{r.name}: feature {name} is not offered with {with_what} "
                    f"(its strategies: {', '.join(allow)})"
                )
            continue
        picked = wanted.get(name)
        modes = feat.get("modes")
        if not isinstance(modes, dict) or not modes:
            if picked is not None:
                raise RecipeError(f"{r.name}: feature {name} has no modes; use --feature {name}")
            on[name] = None
            continue
        here = [m for m, spec in modes.items() if _mode_allowed(spec or {}, vname, gpu, prof)]
        if picked is not None:
            if picked not in modes:
                raise RecipeError(
                    f"{r.name}: unknown mode {picked!r} of feature {name} (modes: {', '.join(modes)})"
                )
            if picked not in here:
                raise RecipeError(
                    f"{r.name}: mode {picked} of feature {name} does not run with variant "
                    f"{vname} on {gpu} (modes here: {', '.join(here) or 'none'})"
                )
        cands = [picked, (variant.get("default_modes") or {}).get(name), feat.get("default_mode")]
        mode = next((c for c in cands if c in here), here[0] if here else None)
        if mode is None:
            if explicit:
                raise RecipeError(
                    f"{r.name}: feature {name} has no mode for variant {vname} on {gpu} "
                    f"(modes: {', '.join(modes)})"
                )
            continue
        on[name] = mode
    return on


def feature_block(
    r: VllmRecipe, name: str, mode: str | None, gpu: str
) -> tuple[list[Item], dict[str, str]]:
    """The argument items and env a feature (or its mode) contributes; a hardware override
    (keyed by GPU id > generation > brand > ``default``) replaces them."""
    feat = r.features[name]
    spec = (feat["modes"][mode] or {}) if mode is not None else feat
    w = f"{r.name}: features.{name}" + (f".modes.{mode}" if mode is not None else "")
    overrides = spec.get("hardware_overrides") or {}
    key = next(
        (k for k in hardware_keys(gpu, r.profiles[gpu]) if overrides.get(k) is not None), None
    )
    ho = overrides[key] if key is not None else {}
    hw = f"{w}.hardware_overrides.{key}"
    args = items(ho["args"], f"{hw}.args") if ho.get("args") is not None else None
    env = env_map(ho["env"], f"{hw}.env") if ho.get("env") is not None else None
    if args is None:
        args = items(spec.get("args"), f"{w}.args")
    if env is None:
        env = env_map(spec.get("env"), f"{w}.env")
    return args, env
