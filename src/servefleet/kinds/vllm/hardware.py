"""Hardware, variants and strategies of a vLLM recipe: what runs where, the defaults the site
lands on, and the parallel size of a strategy on one host."""

from __future__ import annotations

import math
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.vllm.recipe import VllmRecipe

# Most nodes the site offers for one deployment (its MAX_NODES).
MAX_NODES = 16

# Precision -> the hardware it needs, unless the variant sets ``precision_hardware``.
PRECISION_HARDWARE = {
    "nvfp4": {"brand": "NVIDIA", "generation": "blackwell"},
    "fp4": {"brand": "NVIDIA", "generation": "blackwell"},
}


def _generations(profile: dict[str, Any]) -> list[str]:
    gen = profile.get("generation") or profile.get("gpu_generation")
    return [str(g) for g in (gen if isinstance(gen, list) else [gen]) if g]


def generation(profile: dict[str, Any]) -> str | None:
    """The generation that keys overrides (the first of a list, as the site normalizes it)."""
    gens = _generations(profile)
    return gens[0] if gens else None


def is_cpu(profile: dict[str, Any]) -> bool:
    """CPU hardware (``generation: cpu``): its ``gpu_count`` is kept for the schema only and is no
    physical limit (NUMA nodes, not devices), so parallel sizes are not capped by it."""
    return profile.get("generation") == "cpu"


def _brand(profile: dict[str, Any]) -> str | None:
    brand = profile.get("brand")
    return brand.lower() if isinstance(brand, str) else None


def hardware_keys(gpu: str, profile: dict[str, Any]) -> list[str]:
    """The keys of a hardware-keyed map, most specific first: GPU id, generation, brand
    (lowercase), ``default``."""
    keys = [gpu, generation(profile), _brand(profile), "default"]
    return [k for k in keys if k is not None]


def _keyed(mapping: Any, gpu: str, profile: dict[str, Any]) -> Any:
    """A hardware-keyed value: exact GPU id > generation > brand > ``default``."""
    if not isinstance(mapping, dict):
        return None
    for key in hardware_keys(gpu, profile):
        if mapping.get(key) is not None:
            return mapping[key]
    return None


def generation_block(overrides: Any, profile: dict[str, Any]) -> dict[str, Any] | None:
    """The override block for the profile's generation, else for its brand (``nvidia``)."""
    if not isinstance(overrides, dict):
        return None
    gen, brand = generation(profile), _brand(profile)
    block = overrides.get(gen) if gen else None
    if block is None and brand:
        block = overrides.get(brand)
    return block


def _precision_need(variant: dict[str, Any]) -> dict[str, Any]:
    """The hardware a variant's precision needs (``precision_hardware`` or the built-in table)."""
    need = variant.get("precision_hardware")
    if isinstance(need, dict):
        return need
    return PRECISION_HARDWARE.get(str(variant.get("precision")), {})


def _precision_ok(profile: dict[str, Any], variant: dict[str, Any]) -> bool:
    need = _precision_need(variant)
    if not need:
        return True
    if need.get("brand") and profile.get("brand") != need["brand"]:
        return False
    return not need.get("generation") or need["generation"] in _generations(profile)


def variant_runs(r: VllmRecipe, vname: str, gpu: str) -> bool:
    """Whether a variant may run on a GPU: precision, ``supported_hardware``, and for
    non-scalable hardware (one box, no scale-out) its ``vram_minimum_gb``."""
    v, prof = r.variants[vname], r.profiles[gpu]
    supported = v.get("supported_hardware")
    if supported and gpu not in supported:
        return False
    if not _precision_ok(prof, v):
        return False
    if prof.get("scalable") is False:
        need, have = v.get("vram_minimum_gb") or 0, prof.get("vram_gb") or 0
        return need <= 0 or have <= 0 or need <= have
    return True


def offered_hardware(r: VllmRecipe) -> list[str]:
    """GPU ids the recipe can be resolved for, in taxonomy order.

    A profile is offered unless ``meta.hardware`` marks it ``unsupported``, it is restricted
    and the recipe does not declare it, or no variant runs on it.

    + r: the recipe
    """
    declared = r.declared_hardware
    out = []
    for gpu, prof in r.profiles.items():
        if declared.get(gpu) == "unsupported":
            continue
        if prof.get("restricted") and gpu not in declared:
            continue
        if any(variant_runs(r, v, gpu) for v in r.variants):
            out.append(gpu)
    return out


def default_hardware(r: VllmRecipe, vname: str) -> str:
    """The site's landing hardware for a variant: ``meta.default_hardware``, B200/GB200 for
    Blackwell-only precisions, H200, else NVIDIA first then alphabetical."""
    offered = [g for g in offered_hardware(r) if variant_runs(r, vname, g)]
    if not offered:
        raise RecipeError(f"{r.name}: variant {vname} runs on none of the recipe's hardware")
    authored = (r.data.get("meta") or {}).get("default_hardware")
    if authored in offered:
        return str(authored)
    if _precision_need(r.variants[vname]).get("generation") == "blackwell":
        for gpu in ("b200", "gb200"):
            if gpu in offered:
                return gpu
    if "h200" in offered:
        return "h200"
    order = {"NVIDIA": 0, "AMD": 1}
    return sorted(offered, key=lambda g: (order.get(str(r.profiles[g].get("brand")), 9), g))[0]


def default_variant(r: VllmRecipe, gpu: str, preferred: str | None) -> str:
    """The variant the site lands on for a GPU: ``preferred``, ``default``, else the largest
    footprint that runs there.

    + r: the recipe
    + gpu: the GPU id
    + preferred: the recommended variant, if any
    """
    for cand in (preferred, "default"):
        if cand in r.variants and variant_runs(r, cand, gpu):
            return str(cand)
    fitting = [v for v in r.variants if variant_runs(r, v, gpu)]
    if not fitting:
        raise RecipeError(
            f"{r.name}: no variant runs on {gpu}; hardware offered: "
            f"{', '.join(offered_hardware(r))}"
        )
    # Highest fidelity that fits: the largest footprint (the site's pickFittingVariant).
    fitting.sort(key=lambda v: -(r.variants[v].get("vram_minimum_gb") or 0))
    return fitting[0]


def strategy_on(r: VllmRecipe, strategy: str, gpu: str) -> bool:
    """Whether the recipe offers a strategy on this GPU (``strategy_hardware``, else its
    compatible strategies).

    + r: the recipe
    + strategy: the strategy
    + gpu: the GPU id
    """
    gate = _keyed((r.data.get("strategy_hardware") or {}).get(strategy), gpu, r.profiles[gpu])
    if gate is not None:
        return gate != "unsupported"
    return strategy in (r.data.get("compatible_strategies") or r.compatible_strategies)


def single_node(r: VllmRecipe, strategy: str) -> bool:
    """Whether a strategy deploys as one node (``deploy_type: single_node``, the default).

    + r: the recipe
    + strategy: the strategy
    """
    return r.strategies[strategy].get("deploy_type", "single_node") == "single_node"


def _floor(block: Any, strategy: str) -> float:
    if isinstance(block, (int, float)) and not isinstance(block, bool):
        return block
    if isinstance(block, dict):
        value = block.get(strategy)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return 0


def min_gpus(r: VllmRecipe, strategy: str, gpu: str) -> float:
    """The recipe's GPU floor for a strategy (``strategy_min_gpus``): a number for every
    strategy, or a map keyed by strategy id with exact-GPU-id entries (a number, or a map by
    strategy) layered on top; the highest applies. 0 when the recipe sets none.

    + r: the recipe
    + strategy: the strategy
    + gpu: the GPU id
    """
    cfg = r.data.get("strategy_min_gpus")
    if cfg is None:
        return 0
    if not isinstance(cfg, dict):
        return _floor(cfg, strategy)
    return max(_floor(cfg, strategy), _floor(cfg.get(gpu), strategy))


def _gpus_ok(r: VllmRecipe, strategy: str, gpu: str) -> bool:
    """Whether one host of this GPU fits the strategy: its ``hardware_match`` GPU range and
    the recipe's ``strategy_min_gpus`` floor (a single-node strategy cannot grow)."""
    match = r.strategies[strategy].get("hardware_match") or {}
    count = r.profiles[gpu]["gpu_count"]
    if min_gpus(r, strategy, gpu) > count:
        return False
    return match.get("min_gpus", 1) <= count <= match.get("max_gpus", count)


def gpu_shortfall(r: VllmRecipe, strategy: str, gpu: str) -> str:
    """Why a single-node strategy does not fit one host of this GPU (for error messages)."""
    count = r.profiles[gpu]["gpu_count"]
    floor = min_gpus(r, strategy, gpu)
    if floor > count:
        return f"{strategy} needs {floor:g} GPUs (strategy_min_gpus), {gpu} has {count}"
    match = r.strategies[strategy].get("hardware_match") or {}
    return (
        f"{strategy} runs on {match.get('min_gpus', 1)}..{match.get('max_gpus', count)} GPUs "
        f"(hardware_match), {gpu} has {count}"
    )


def fits_one_node(r: VllmRecipe, vname: str, gpu: str) -> bool:
    """Whether the variant's weights fit one node: ``vram_minimum_gb`` <= the profile's
    ``vram_gb`` (either missing: it fits, as the site does not block on missing sizes).

    + r: the recipe
    + vname: the variant
    + gpu: the GPU id
    """
    need, have = r.variants[vname].get("vram_minimum_gb") or 0, r.profiles[gpu].get("vram_gb") or 0
    return need <= 0 or have <= 0 or need <= have


def nodes_needed(r: VllmRecipe, vname: str, strategy: str, gpu: str) -> int:
    """Nodes of this GPU a multi-node strategy takes for the variant: enough for its
    ``vram_minimum_gb`` and the recipe's ``strategy_min_gpus`` floor, at least 2.

    + r: the recipe
    + vname: the variant
    + strategy: a multi-node strategy
    + gpu: the GPU id
    """
    prof = r.profiles[gpu]
    need, have = r.variants[vname].get("vram_minimum_gb") or 0, prof.get("vram_gb") or 0
    by_vram = math.ceil(need / have) if need > 0 and have > 0 else 1
    by_floor = math.ceil(min_gpus(r, strategy, gpu) / (int(prof["gpu_count"]) or 8))
    return max(2, by_vram, by_floor)


def multi_node_fits(r: VllmRecipe, vname: str, gpu: str) -> list[tuple[str, int]]:
    """The multi-node strategies of the recipe on this GPU that would hold the variant within the
    site's node limit (:data:`MAX_NODES`), each with the nodes it takes; none on hardware that
    does not scale out (``scalable: false``).

    + r: the recipe
    + vname: the variant
    + gpu: the GPU id
    """
    if r.profiles[gpu].get("scalable") is False:
        return []
    out = []
    for s in r.compatible_strategies:
        if not strategy_on(r, s, gpu) or r.strategies[s].get("deploy_type") != "multi_node":
            continue
        nodes = nodes_needed(r, vname, s, gpu)
        if nodes <= MAX_NODES:
            out.append((s, nodes))
    return out


def too_big_for_one_node(r: VllmRecipe, vname: str, gpu: str) -> str:
    """Why a single-node command is refused for a variant that does not fit one node (one line).

    + r: the recipe
    + vname: the variant
    + gpu: the GPU id
    """
    need = r.variants[vname].get("vram_minimum_gb") or 0
    have = r.profiles[gpu].get("vram_gb") or 0
    fits = multi_node_fits(r, vname, gpu)
    where = (
        "multi-node strategies that fit: " + ", ".join(f"{s} ({n} nodes)" for s, n in fits)
        if fits
        else "no multi-node strategy of the recipe fits it"
    )
    return (
        f"{r.name}: variant {vname} needs {need:g} GB (vram_minimum_gb) but one {gpu} node has "
        f"{have:g} GB (vram_gb), so no single-node command; {where}. servefleet renders one "
        "host per server and cannot deploy a model spanning several hosts yet"
    )


def single_node_strategies(r: VllmRecipe, gpu: str) -> list[str]:
    """Compatible strategies that render as one ``vllm serve`` on one host of this GPU.

    + r: the recipe
    + gpu: a GPU id of the taxonomy
    """
    return [
        s
        for s in r.compatible_strategies
        if strategy_on(r, s, gpu) and single_node(r, s) and _gpus_ok(r, s, gpu)
    ]


def default_strategy(r: VllmRecipe, gpu: str) -> str:
    """The single-node strategy the site lands on for a GPU (the recommended one, the recipe's
    ``default_strategy``, ``single_node_tp``, else the first usable); none: a one-line error.

    + r: the recipe
    + gpu: the GPU id
    """
    usable = single_node_strategies(r, gpu)
    rec = (r.recommended or {}).get("strategy")
    for cand in (rec, r.data.get("default_strategy"), "single_node_tp"):
        if cand in usable:
            return str(cand)
    if usable:
        return usable[0]
    here = [s for s in r.compatible_strategies if strategy_on(r, s, gpu)]
    single = [s for s in here if single_node(r, s)]
    why = "; ".join(gpu_shortfall(r, s, gpu) for s in single)
    multi = [s for s in here if not single_node(r, s)]
    raise RecipeError(
        f"{r.name}: no single-node strategy runs on {gpu}"
        + (f" ({why})" if why else f" (compatible: {', '.join(here) or 'none'})")
        + (
            f"; {', '.join(multi)} span several hosts and cannot be rendered for one"
            if multi
            else ""
        )
    )


def parallel_size(r: VllmRecipe, vname: str, strategy: str, gpu: str) -> int:
    """GPUs the strategy's parallel flag spans on one host.

    ``single_node_tp``: the variant's ``tp``, else ``strategy_overrides.single_node_tp.tp``
    (a number or a map keyed by GPU id > generation > brand > ``default``), capped at the
    profile's ``gpu_count`` except on CPU hardware (``generation: cpu``, whose ``gpu_count`` is
    no physical limit: the site does not cap it); else 1 when ``vram_minimum_gb`` fits one GPU,
    else ``gpu_count``. Other strategies: ``gpu_count``.

    + r: the recipe
    + vname: the variant
    + strategy: the strategy
    + gpu: the GPU id
    """
    prof = r.profiles[gpu]
    count = int(prof["gpu_count"])
    if strategy != "single_node_tp":
        return count
    variant = r.variants[vname]
    so = ((r.data.get("strategy_overrides") or {}).get(strategy) or {}).get("tp")
    for raw in (variant.get("tp"), so):
        declared = raw if isinstance(raw, int) else _keyed(raw, gpu, prof)
        if isinstance(declared, int) and not isinstance(declared, bool) and declared > 0:
            return declared if is_cpu(prof) else min(declared, count)
    need = variant.get("vram_minimum_gb") or 0
    per_gpu = (prof.get("vram_gb") or 0) / count if count else 0
    if not need or per_gpu <= 0:
        return count
    return 1 if need <= per_gpu else count
