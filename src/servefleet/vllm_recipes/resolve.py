"""Resolve a selection of a vLLM recipe to one host's ``vllm serve`` argv and env.

Layering (the site's ``buildArgs``), each layer appended to one argument list:

1. ``model.base_args``
2. the variant's ``extra_args``, then its exact-GPU ``hardware_overrides.<gpu>.extra_args``
3. the strategy's ``vllm_args``, then its parallel flag with the parallel size
4. ``strategy_overrides.<strategy>`` ``extra_args`` / ``vllm_args``
5. hardware overrides: the recipe's block for the profile's generation (brand as fallback),
   then the variant's generation block, then the recipe's exact-GPU block; a
   ``strategy_overrides.<strategy>.hardware_overrides.<generation>`` block replaces the recipe
   and variant generation blocks; its exact-GPU block is added last
6. (advanced args: none, the CLI offers no such axis)
7. enabled features in the recipe's order (a feature's hardware override replaces its args; a
   feature with ``modes`` contributes its selected mode's args)
8. (KV offload: not offered here)

then ``dedupe_args``: the last occurrence of each flag wins. Env: ``base_env`` -> variant
``extra_env`` (non-default variants) -> strategy env -> hardware overrides (same order as the
args) -> ``strategy_overrides`` env -> features' env.
"""

from __future__ import annotations

import json
from typing import Any

from servefleet.errors import RecipeError
from servefleet.spec import Requirements, Server, ServeSpec
from servefleet.vllm_args import dedupe_args, env_map, token_list
from servefleet.vllm_recipes.features import _feature_block, _select_features
from servefleet.vllm_recipes.hardware import (
    _default_hardware,
    _default_strategy,
    _default_variant,
    _generation_block,
    _single_node,
    _strategy_on,
    _variant_runs,
    offered_hardware,
    parallel_size,
    single_node_strategies,
)
from servefleet.vllm_recipes.recipe import VllmRecipe


def _layers(r: VllmRecipe, vname: str, strategy: str, gpu: str) -> list[tuple[str, Any]]:
    """The override blocks of steps 2, 4 and 5, in order: (label, block with extra_args/env)."""
    prof = r.profiles[gpu]
    variant = r.variants[vname]
    so = (r.data.get("strategy_overrides") or {}).get(strategy) or {}
    v_ho = variant.get("hardware_overrides") or {}
    r_ho = r.data.get("hardware_overrides") or {}
    s_ho = so.get("hardware_overrides") or {}
    hw: list[tuple[str, Any]] = []
    strategy_gen = _generation_block(s_ho, prof)
    if strategy_gen is not None:
        hw.append(("strategy_generation", strategy_gen))
    else:
        hw.append(("recipe_generation", _generation_block(r_ho, prof)))
        hw.append(("variant_generation", _generation_block(v_ho, prof)))
    hw.append(("recipe_gpu", r_ho.get(gpu)))
    hw.append(("strategy_gpu", s_ho.get(gpu)))
    return [("variant_gpu", v_ho.get(gpu)), ("strategy_overrides", so), *hw]


def resolve_vllm(
    recipe: VllmRecipe,
    *,
    hardware: str | None = None,
    strategy: str | None = None,
    variant: str | None = None,
    tp: int | None = None,
    features: list[str] | tuple[str, ...] = (),
    no_features: list[str] | tuple[str, ...] = (),
) -> ServeSpec:
    """Resolve a selection of a vLLM recipe to the ``vllm serve`` argv and env of one host.

    Unset axes take the recipe's defaults (the JSON form: its ``recommended_command``).

    + recipe: a loaded recipe
    + hardware: a GPU id of the taxonomy (``h200``, ``mi300x``, ...)
    + strategy: a single-node strategy the recipe is compatible with
    + variant: a variant name (``default``, ``fp8``, ...)
    + tp: the parallel size, overriding the recipe's rule
    + features: ``NAME`` (turn on) or ``NAME=MODE`` (turn on with a mode)
    + no_features: feature names to turn off
    """
    r = recipe
    rec = r.recommended or {}
    features, no_features = list(features), list(no_features)
    offered = offered_hardware(r)
    if variant is not None and variant not in r.variants:
        raise RecipeError(
            f"{r.name}: unknown variant {variant!r} (variants: {', '.join(r.variants)})"
        )
    if hardware is not None and hardware not in offered:
        what = "unknown hardware" if hardware not in r.profiles else "hardware not offered:"
        raise RecipeError(f"{r.name}: {what} {hardware!r} (hardware: {', '.join(offered)})")
    if hardware is None:
        rec_variant = str(rec.get("variant"))
        vpick = variant or (rec_variant if rec_variant in r.variants else "default")
        rec_hw = str(rec.get("hardware"))
        if rec_hw in offered and _variant_runs(r, vpick, rec_hw):
            hardware = rec_hw
        else:
            hardware = _default_hardware(r, vpick)
    if variant is None:
        variant = _default_variant(r, hardware, rec.get("variant"))
    elif not _variant_runs(r, variant, hardware):
        where = [g for g in offered if _variant_runs(r, variant, g)]
        raise RecipeError(
            f"{r.name}: variant {variant} does not run on {hardware} "
            f"(hardware for {variant}: {', '.join(where) or 'none'})"
        )
    if strategy is None:
        strategy = _default_strategy(r, hardware)
    usable = single_node_strategies(r, hardware)
    if strategy not in r.compatible_strategies or not _strategy_on(r, strategy, hardware):
        what = "unknown strategy" if strategy not in r.strategies else "strategy not compatible:"
        raise RecipeError(
            f"{r.name}: {what} {strategy!r} on {hardware} "
            f"(single-node strategies: {', '.join(usable) or 'none'})"
        )
    if not _single_node(r, strategy):
        raise RecipeError(
            f"{r.name}: strategy {strategy} is {r.strategies[strategy].get('deploy_type')} and "
            f"cannot be rendered for one host (single-node strategies: {', '.join(usable) or 'none'})"
        )
    if strategy not in usable:
        raise RecipeError(
            f"{r.name}: strategy {strategy} does not fit {hardware}'s "
            f"{r.profiles[hardware]['gpu_count']} GPUs (single-node strategies: "
            f"{', '.join(usable) or 'none'})"
        )
    count = int(r.profiles[hardware]["gpu_count"])
    size = parallel_size(r, variant, strategy, hardware)
    if tp is not None:
        if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= count:
            raise RecipeError(f"{r.name}: --tp {tp} out of range for {hardware} (1..{count})")
        size = tp
    enabled = _select_features(r, variant, strategy, hardware, features, no_features)
    argv, env = _build(r, variant, strategy, hardware, size, enabled)
    selection = {
        "hardware": hardware,
        "strategy": strategy,
        "variant": variant,
        "features": ",".join(n if m is None else f"{n}={m}" for n, m in enabled.items()),
    }
    return ServeSpec(
        recipe=r.name,
        kind="vllm",
        selection=selection,
        servers=[Server(role="main", argv=argv, env=env, npus=size)],
        requirements=Requirements(models=_models(argv[2], argv)),
        compile_fingerprint=None,
    )


def _build(
    r: VllmRecipe,
    vname: str,
    strategy: str,
    gpu: str,
    size: int,
    enabled: dict[str, str | None],
) -> tuple[list[str], dict[str, str]]:
    n = r.name
    model = r.data["model"]
    variant = r.variants[vname]
    strat = r.strategies[strategy]
    layers = dict(_layers(r, vname, strategy, gpu))

    def block_args(label: str, *keys: str) -> list[str]:
        b = layers.get(label) or {}
        return [t for k in keys for t in token_list(b.get(k), f"{n}: {label}.{k}")]

    def block_env(label: str, *keys: str) -> dict[str, str]:
        b = layers.get(label) or {}
        out: dict[str, str] = {}
        for k in keys:
            out.update(env_map(b.get(k), f"{n}: {label}.{k}"))
        return out

    hw_labels = [k for k in layers if k not in ("variant_gpu", "strategy_overrides")]
    args: list[str] = []
    args += token_list(model.get("base_args"), f"{n}: model.base_args")  # 1
    args += token_list(variant.get("extra_args"), f"{n}: variants.{vname}.extra_args")  # 2
    args += block_args("variant_gpu", "extra_args")
    args += token_list(strat.get("vllm_args"), f"strategy {strategy}.vllm_args")  # 3
    args += [str(strat.get("parallel_flag") or "--tensor-parallel-size"), str(size)]
    args += block_args("strategy_overrides", "extra_args", "vllm_args")  # 4
    for label in hw_labels:  # 5
        args += block_args(label, "extra_args")
    blocks = {name: _feature_block(r, name, mode, gpu) for name, mode in enabled.items()}
    for b in blocks.values():  # 7
        args += b["args"]

    env: dict[str, str] = {}
    env.update(env_map(model.get("base_env"), f"{n}: model.base_env"))
    if vname != "default":
        env.update(env_map(variant.get("extra_env"), f"{n}: variants.{vname}.extra_env"))
    env.update(env_map(strat.get("env"), f"strategy {strategy}.env"))
    for label in ("strategy_generation", "recipe_generation", "variant_generation"):
        env.update(block_env(label, "extra_env"))
    env.update(block_env("variant_gpu", "extra_env"))
    env.update(block_env("recipe_gpu", "extra_env"))
    env.update(block_env("strategy_overrides", "env", "extra_env"))
    env.update(block_env("strategy_gpu", "extra_env"))
    for b in blocks.values():
        env.update(b["env"])

    model_id = str(variant.get("model_id") or model["model_id"])
    return ["vllm", "serve", model_id, *dedupe_args(args)], env


def _models(model_id: str, argv: list[str]) -> list[str]:
    """The served model and a draft model named in ``--speculative-config``."""
    models = [model_id]
    for i, tok in enumerate(argv):
        raw = None
        if tok == "--speculative-config" and i + 1 < len(argv):
            raw = argv[i + 1]
        elif tok.startswith("--speculative-config="):
            raw = tok.split("=", 1)[1]
        if raw is None:
            continue
        try:
            cfg = json.loads(raw)
        except json.JSONDecodeError:
            continue
        draft = cfg.get("model") if isinstance(cfg, dict) else None
        if isinstance(draft, str) and draft and draft not in models:
            models.append(draft)
    return models
