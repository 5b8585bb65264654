"""Resolve a selection of a vLLM recipe to one host's ``vllm serve`` argv and env.

The layers and the order they apply in are data: :data:`ARG_ORDER` and :data:`ENV_ORDER` (the
site's ``buildArgs`` / ``buildEnv``), :data:`OMNI_ARG_ORDER` and :data:`OMNI_ENV_ORDER` (its
``resolveOmniCommand``). In short: base, variant, strategy, strategy overrides, hardware class
(generation, else brand), exact hardware, features, the composing KV-offload option; for env
the strategy's and the KV option's env, then the strategy overrides before every hardware layer.
A strategy's generation override replaces the recipe's and the variant's generation blocks.

The argument list becomes argv words as the site's shell command splits it (``words``: an item
holding a flag and its value, ``"--max-model-len 32768"``, gives two words), then
``dedupe_args``: the last occurrence of each flag wins.

Features: without ``features`` / ``no_features`` the site's defaults are on (every feature not
opt-in, ``opt_in_features`` plus ``hardware_opt_in_features.<gpu>``, and every feature the
variant's ``default_modes`` names). A feature's hardware override replaces its args; a feature
with ``modes`` contributes its selected mode's args.

A recipe without strategies renders its base command: the layers above without the strategy
ones (the GPUs it takes come from its own arguments, 1 when they name none). An omni recipe
(``meta.tasks`` has ``omni``) renders as the site's ``resolveOmniCommand``: the served model is
the task's exact-GPU override's ``model_id``, else the task's, else the variant's; no strategy,
no features.

Refused on purpose (the site prints a command that cannot start there): a variant whose
``vram_minimum_gb`` exceeds the node's ``vram_gb`` (no single-node command; the message names
the multi-node strategies that would fit), a strategy whose ``hardware_match`` GPU range or
``strategy_min_gpus`` floor excludes the hardware, and a command asking for more GPUs than the
host has (tensor x data x pipeline parallel size; CPU hardware is not capped). A feature's or
the KV-offload option's ``companion`` runs as a second server beside it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.base.vllm_args import dedupe_args, env_map, flag_name, is_flag
from servefleet.kinds.base import draft_model
from servefleet.kinds.loader import load_json_text
from servefleet.kinds.roles import PD_ROLES, pd_router
from servefleet.kinds.vllm import pd
from servefleet.kinds.vllm.features import feature_block, parse_features, select_features
from servefleet.kinds.vllm.hardware import (
    default_hardware,
    default_strategy,
    default_variant,
    fits_one_node,
    generation,
    generation_block,
    gpu_shortfall,
    offered_hardware,
    parallel_size,
    single_node,
    single_node_strategies,
    strategy_on,
    too_big_for_one_node,
    variant_runs,
)
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.kinds.vllm.words import Item, items, words
from servefleet.spec import Requirements, Server, ServeSpec

# Flags whose values multiply into the GPUs one server takes (aliases as vLLM spells them).
_PARALLEL = {
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--data-parallel-size": "dp",
    "-dp": "dp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
}


# The order the layers of a selection apply in, as the site's builder applies them
# (``buildArgs`` / ``buildEnv``): each appends its arguments to one list (the last occurrence of
# a flag wins) and updates one env mapping (the last value of a variable wins).
#
# + base: ``model.base_args`` / ``base_env``
# + variant: ``variants.<v>.extra_args`` / ``extra_env`` (the ``default`` variant too)
# + variant_gpu: ``variants.<v>.hardware_overrides.<gpu>`` (exact GPU id)
# + strategy: ``strategies/<s>.yaml`` ``vllm_args``, then its parallel flag with the size / ``env``
# + strategy_overrides: ``strategy_overrides.<s>`` ``extra_args`` + ``vllm_args`` /
#   ``env`` + ``extra_env``
# + strategy_generation: ``strategy_overrides.<s>.hardware_overrides.<generation>`` (brand as
#   fallback); when present it replaces recipe_generation and variant_generation
# + recipe_generation / variant_generation: ``hardware_overrides.<generation>`` of the recipe,
#   then of the variant (hardware class: generation, else brand)
# + recipe_gpu / strategy_gpu: ``hardware_overrides.<gpu>`` of the recipe, then of
#   ``strategy_overrides.<s>`` (exact hardware)
# + role_gpu: a pd_cluster role's ``strategy_overrides.<s>.<role>.hardware_overrides.<gpu>``
# (HARDWARE_ORDER: the hardware layers, the hardware class before the exact hardware)
#
# A pd_cluster role (prefill, decode) takes the same layers, with its own: strategy is the
# role's ``vllm_args`` and its pool's arguments (``pd.pool_items``) / the role's ``env`` and
# its node's GPUs; strategy_overrides is ``strategy_overrides.<s>.<role>`` ``extra_args`` +
# ``vllm_args`` / ``strategy_overrides.<s>.env`` + ``.<role>.env``.
# + features: the enabled features in recipe order
# + kv_offload: the composing KV-offload option (``taxonomy.kv_offload.<key>``)
HARDWARE_ORDER = (
    "strategy_generation",
    "recipe_generation",
    "variant_generation",
    "recipe_gpu",
    "strategy_gpu",
    "role_gpu",
)
ARG_ORDER = (
    "base",
    "variant",
    "variant_gpu",
    "strategy",
    "strategy_overrides",
    *HARDWARE_ORDER,
    "features",
    "kv_offload",
)
# Env: the strategy's own env, the KV-offload option's, then the recipe's strategy overrides
# before every hardware layer.
ENV_ORDER = (
    "base",
    "variant",
    "variant_gpu",
    "strategy",
    "kv_offload",
    "strategy_overrides",
    *HARDWARE_ORDER,
    "features",
)
# An omni recipe (the site's ``resolveOmniCommand``): no strategy, no features; the variant's
# own args and env apply to non-default variants only; ``--port`` and ``--omni`` close it.
OMNI_ARG_ORDER = (
    "base",
    "variant",
    "task",
    "recipe_generation",
    "variant_generation",
    "variant_gpu",
    "port",
    "omni",
)
OMNI_ENV_ORDER = ("base", "variant", "recipe_generation", "variant_generation", "variant_gpu")

# One layer: its argument items and env (empty when it does not apply).
Layer = tuple[list[Item], dict[str, str]]


def _block_layer(block: Any, where: str, args: tuple[str, ...], envs: tuple[str, ...]) -> Layer:
    b = block or {}
    seq = [t for k in args for t in items(b.get(k), f"{where}.{k}")]
    env: dict[str, str] = {}
    for k in envs:
        env.update(env_map(b.get(k), f"{where}.{k}"))
    return seq, env


def _override_layers(
    r: VllmRecipe, vname: str, strategy: str | None, gpu: str, role: str | None = None
) -> dict[str, Layer]:
    """The override layers: variant_gpu, strategy_overrides and the hardware ones (a pd_cluster
    role's own strategy_overrides and role_gpu when ``role`` is given)."""
    n = r.name
    prof = r.profiles[gpu]
    variant = r.variants[vname]
    so = ((r.data.get("strategy_overrides") or {}).get(strategy) or {}) if strategy else {}
    v_ho = variant.get("hardware_overrides") or {}
    r_ho = r.data.get("hardware_overrides") or {}
    s_ho = so.get("hardware_overrides") or {}
    sw = f"{n}: strategy_overrides.{strategy}"
    extra = (("extra_args",), ("extra_env",))
    out = {
        "variant_gpu": _block_layer(
            v_ho.get(gpu), f"{n}: variants.{vname}.hardware_overrides.{gpu}", *extra
        ),
        "strategy_overrides": _block_layer(
            so, sw, ("extra_args", "vllm_args"), ("env", "extra_env")
        ),
        "recipe_gpu": _block_layer(r_ho.get(gpu), f"{n}: hardware_overrides.{gpu}", *extra),
        "strategy_gpu": _block_layer(s_ho.get(gpu), f"{sw}.hardware_overrides.{gpu}", *extra),
    }
    if role is not None:
        rb, rw = so.get(role) or {}, f"{sw}.{role}"
        role_args, role_env = _block_layer(rb, rw, ("extra_args", "vllm_args"), ("env",))
        out["strategy_overrides"] = (role_args, {**env_map(so.get("env"), f"{sw}.env"), **role_env})
        r_gpu = (rb.get("hardware_overrides") or {}).get(gpu)
        out["role_gpu"] = _block_layer(r_gpu, f"{rw}.hardware_overrides.{gpu}", *extra)
    strategy_gen = generation_block(s_ho, prof)
    if strategy_gen is not None:
        out["strategy_generation"] = _block_layer(strategy_gen, f"{sw}.hardware_overrides", *extra)
    else:
        out["recipe_generation"] = _block_layer(
            generation_block(r_ho, prof), f"{n}: hardware_overrides", *extra
        )
        out["variant_generation"] = _block_layer(
            generation_block(v_ho, prof), f"{n}: variants.{vname}.hardware_overrides", *extra
        )
    return out


def _apply(
    layers: dict[str, Layer], arg_order: tuple[str, ...], env_order: tuple[str, ...]
) -> tuple[list[str], dict[str, str]]:
    """The deduplicated argv words and the env of the layers, each in its order."""
    seq: list[Item] = []
    for label in arg_order:
        seq += layers.get(label, ([], {}))[0]
    env: dict[str, str] = {}
    for label in env_order:
        env.update(layers.get(label, ([], {}))[1])
    return dedupe_args(words(seq)), env


def resolve_vllm(
    recipe: VllmRecipe,
    *,
    hardware: str | None = None,
    strategy: str | None = None,
    variant: str | None = None,
    tp: int | None = None,
    features: list[str] | tuple[str, ...] = (),
    no_features: list[str] | tuple[str, ...] = (),
    kv_offload: str | None = None,
    task: str | None = None,
    pool_parallelism: str | None = None,
) -> ServeSpec:
    """Resolve a selection of a vLLM recipe to the ``vllm serve`` argv and env of one host, or,
    for a ``pd_cluster`` strategy, of its prefill and decode roles and the router in front.

    Unset axes take the recipe's defaults (the JSON form: its ``recommended_command``).

    + recipe: a loaded recipe
    + hardware: a GPU id of the taxonomy (``h200``, ``mi300x``, ...)
    + strategy: a single-node strategy the recipe is compatible with (none for a recipe
      without strategies)
    + variant: a variant name (``default``, ``fp8``, ...)
    + tp: the parallel size, overriding the recipe's rule and any later layer
    + features: ``NAME`` (turn on) or ``NAME=MODE`` (turn on with a mode)
    + no_features: feature names to turn off
    + kv_offload: a composing KV-offload option of the taxonomy (``simple``, ``lmcache``, ...)
    + task: an omni recipe's task (``omni.tasks`` key or id; default: the first)
    + pool_parallelism: ``pd_cluster`` only: both pools' parallelism (``tp``, ``tep``, ``dep``;
      default: each role's own, see :mod:`servefleet.kinds.vllm.pd`)
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
        if rec_hw in offered and variant_runs(r, vpick, rec_hw):
            hardware = rec_hw
        else:
            hardware = default_hardware(r, vpick)
    if variant is None:
        variant = default_variant(r, hardware, rec.get("variant"))
    elif not variant_runs(r, variant, hardware):
        where = [g for g in offered if variant_runs(r, variant, g)]
        raise RecipeError(
            f"{r.name}: variant {variant} does not run on {hardware} "
            f"(hardware for {variant}: {', '.join(where) or 'none'})"
        )
    count = int(r.profiles[hardware]["gpu_count"])
    if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= count):
        raise RecipeError(f"{r.name}: --tp {tp} out of range for {hardware} (1..{count})")
    if pool_parallelism is not None and not (
        strategy and strategy in r.strategies and pd.is_pd(r, strategy)
    ):
        raise RecipeError(
            f"{r.name}: a pool parallelism ({pool_parallelism!r}) is given, but only a "
            f"pd_cluster strategy has pools (strategy: {strategy or 'the default'})"
        )
    if r.is_omni or not r.compatible_strategies:
        if strategy is not None:
            kind = "an omni recipe" if r.is_omni else "a recipe without strategies"
            raise RecipeError(
                f"{r.name}: strategy {strategy!r} given, but {kind} has none: it renders "
                f"one server as it is (strategies: none)"
            )
        return _resolve_unstrategied(
            r, variant, hardware, tp, features, no_features, kv_offload, task
        )
    if task is not None:
        raise RecipeError(f"{r.name}: task {task!r} given, but only omni recipes have tasks")
    if strategy is None:
        strategy = default_strategy(r, hardware)
    usable = single_node_strategies(r, hardware)
    if strategy not in r.compatible_strategies or not strategy_on(r, strategy, hardware):
        what = "unknown strategy" if strategy not in r.strategies else "strategy not compatible:"
        raise RecipeError(
            f"{r.name}: {what} {strategy!r} on {hardware} "
            f"(single-node strategies: {', '.join(usable) or 'none'})"
        )
    if pd.is_pd(r, strategy):
        return _resolve_pd(
            r, variant, hardware, strategy, tp, features, no_features, kv_offload, pool_parallelism
        )
    if not single_node(r, strategy):
        raise RecipeError(
            f"{r.name}: strategy {strategy} is {r.strategies[strategy].get('deploy_type')} and "
            f"cannot be rendered for one host (single-node strategies: {', '.join(usable) or 'none'})"
        )
    if not fits_one_node(r, variant, hardware):
        raise RecipeError(too_big_for_one_node(r, variant, hardware))
    if strategy not in usable:
        raise RecipeError(
            f"{r.name}: strategy {strategy} does not fit one {hardware} host: "
            f"{gpu_shortfall(r, strategy, hardware)} (single-node strategies: "
            f"{', '.join(usable) or 'none'})"
        )
    size = parallel_size(r, variant, strategy, hardware) if tp is None else tp
    enabled = select_features(r, variant, strategy, hardware, features, no_features)
    kv = _kv_option(r, kv_offload, strategy, hardware)
    flag = str(r.strategies[strategy].get("parallel_flag") or "--tensor-parallel-size")
    args, env = _build(r, variant, strategy, hardware, size, enabled, kv)
    model_id = str(r.variants[variant].get("model_id") or r.data["model"]["model_id"])
    return _spec(
        r,
        {"hardware": hardware, "strategy": strategy, "variant": variant},
        enabled,
        kv_offload,
        ["vllm", "serve", model_id],
        _with_size(args, flag, tp),
        env,
        kv,
    )


def _resolve_pd(
    r: VllmRecipe,
    variant: str,
    hardware: str,
    strategy: str,
    tp: int | None,
    features: list[str],
    no_features: list[str],
    kv_offload: str | None,
    chosen: str | None,
) -> ServeSpec:
    """A ``pd_cluster`` selection: its prefill and decode roles, one node each, and the router
    (:mod:`servefleet.kinds.vllm.pd`). Refused: ``--tp`` (a pool's size comes from its
    parallelism), KV offload (the strategy owns ``--kv-transfer-config``), a feature that runs a
    companion (the site renders none under pd_cluster), and a variant one node cannot hold."""
    if tp is not None:
        raise RecipeError(
            f"{r.name}: --tp sizes a single-node strategy; {strategy}'s pools take every GPU "
            f"of their node (pool parallelism: {', '.join(pd.pool_modes(r))})"
        )
    _kv_option(r, kv_offload, strategy, hardware)
    if not fits_one_node(r, variant, hardware):
        need = r.variants[variant].get("vram_minimum_gb") or 0
        have = r.profiles[hardware].get("vram_gb") or 0
        raise RecipeError(
            f"{r.name}: variant {variant} needs {need:g} GB (vram_minimum_gb) but one {hardware} "
            f"node has {have:g} GB (vram_gb), so a {strategy} pool of one node cannot hold it; "
            "servefleet renders one node per pool and cannot render pools spanning several "
            "nodes yet"
        )
    enabled = select_features(r, variant, strategy, hardware, features, no_features)
    helpers = [f for f in enabled if (r.features[f].get("companion") or {}).get("command")]
    if helpers:
        raise RecipeError(
            f"{r.name}: feature {helpers[0]} runs a companion beside its server, which "
            f"{strategy} does not render; allowed: --no-feature {helpers[0]}"
        )
    count = int(r.profiles[hardware]["gpu_count"])
    model_id = str(r.variants[variant].get("model_id") or r.data["model"]["model_id"])
    servers, modes, locals_ = [], [], []
    for role in PD_ROLES:
        mode = pd.parallelism(r, strategy, role, chosen)
        args, env = _build(r, variant, strategy, hardware, count, enabled, None, role, mode)
        servers.append(
            Server(
                role=role,
                argv=["vllm", "serve", model_id, *args],
                env=env,
                npus=_devices(r, hardware, args),
            )
        )
        modes.append(mode)
        locals_.append(pd.dp_local(r, strategy, role, mode, count))
    selection = {"hardware": hardware, "strategy": strategy, "variant": variant}
    selection["pool_parallelism"] = (
        modes[0]
        if len(set(modes)) == 1
        else ",".join(f"{p}={m}" for p, m in zip(PD_ROLES, modes, strict=True))
    )
    prefill, decode = servers
    router = pd_router(
        pd.router_policy(r, strategy), prefill, decode, pd.intra_node_dp(r, strategy, locals_)
    )
    launcher = ["vllm", "serve", model_id]
    spec = _spec(r, selection, enabled, None, launcher, prefill.argv[3:], prefill.env, None)
    models = list(dict.fromkeys(m for s in servers for m in _models(model_id, s.argv[3:])))
    requirements = replace(spec.requirements, models=models)
    return replace(spec, servers=servers, router=router, requirements=requirements)


def _resolve_unstrategied(
    r: VllmRecipe,
    variant: str,
    hardware: str,
    tp: int | None,
    features: list[str],
    no_features: list[str],
    kv_offload: str | None,
    task: str | None,
) -> ServeSpec:
    """An omni recipe, or one without strategies: its base command as one server."""
    selection = {"hardware": hardware, "strategy": "", "variant": variant}
    if not r.is_omni:
        if task is not None:
            raise RecipeError(f"{r.name}: task {task!r} given, but only omni recipes have tasks")
        if not fits_one_node(r, variant, hardware):
            raise RecipeError(too_big_for_one_node(r, variant, hardware))
        enabled = select_features(r, variant, None, hardware, features, no_features)
        kv = _kv_option(r, kv_offload, None, hardware)
        args, env = _build(r, variant, None, hardware, 0, enabled, kv)
        model_id = str(r.variants[variant].get("model_id") or r.data["model"]["model_id"])
        launcher = ["vllm", "serve", model_id]
        return _spec(
            r, selection, enabled, kv_offload, launcher, _with_size(args, None, tp), env, kv
        )
    parse_features(r, features, no_features)  # unknown names are errors all the same
    if features:
        raise RecipeError(
            f"{r.name}: an omni recipe renders no features (the site's omni command takes "
            f"none); drop --feature {' --feature '.join(features)}"
        )
    if kv_offload is not None:
        raise RecipeError(
            f"{r.name}: KV offload {kv_offload!r} composes with a serving strategy; an omni "
            "recipe has none"
        )
    key, spec = _omni_task(r, task)
    if key is not None:
        selection["task"] = key
    launcher, args, env = _build_omni(r, variant, hardware, spec)
    return _spec(r, selection, {}, None, launcher, _with_size(args, None, tp), env, None)


def _spec(
    r: VllmRecipe,
    selection: dict[str, str],
    enabled: dict[str, str | None],
    kv_offload: str | None,
    launcher: list[str],
    args: list[str],
    env: dict[str, str],
    kv: dict[str, Any] | None,
) -> ServeSpec:
    gpu = selection["hardware"]
    selection["features"] = ",".join(n if m is None else f"{n}={m}" for n, m in enabled.items())
    if kv is not None and kv_offload is not None:
        selection["kv_offload"] = kv_offload
    npus = _devices(r, gpu, args)
    servers = [Server(role="main", argv=[*launcher, *args], env=env, npus=npus)]
    servers += _companions(r, enabled, kv_offload, kv)
    packages = _install_names(r, kv.get("install")) if kv is not None else []
    return ServeSpec(
        recipe=r.name,
        kind="vllm",
        selection=selection,
        servers=servers,
        requirements=Requirements(packages=packages, models=_models(launcher[-1], args)),
        compile_fingerprint=None,
    )


def _build(
    r: VllmRecipe,
    vname: str,
    strategy: str | None,
    gpu: str,
    size: int,
    enabled: dict[str, str | None],
    kv: dict[str, Any] | None,
    role: str | None = None,
    pool_mode: str = "tp",
) -> tuple[list[str], dict[str, str]]:
    """The deduplicated arguments (after the model) and the env of a selection
    (:data:`ARG_ORDER`, :data:`ENV_ORDER`); of one pd_cluster role and its pool's parallelism
    ``pool_mode`` when ``role`` is given."""
    n = r.name
    model = r.data["model"]
    variant = r.variants[vname]
    layers = _override_layers(r, vname, strategy, gpu, role)
    layers["base"] = (
        items(model.get("base_args"), f"{n}: model.base_args"),
        env_map(model.get("base_env"), f"{n}: model.base_env"),
    )
    layers["variant"] = _block_layer(
        variant, f"{n}: variants.{vname}", ("extra_args",), ("extra_env",)
    )
    if strategy and role is not None:
        count = int(r.profiles[gpu]["gpu_count"])
        block, where = r.strategies[strategy].get(role) or {}, f"strategy {strategy}.{role}"
        layers["strategy"] = (
            items(block.get("vllm_args"), f"{where}.vllm_args")
            + pd.pool_items(r, strategy, role, pool_mode, count),
            {**env_map(block.get("env"), f"{where}.env"), **pd.pool_env(count)},
        )
    elif strategy:
        strat = r.strategies[strategy]
        flag = str(strat.get("parallel_flag") or "--tensor-parallel-size")
        layers["strategy"] = (
            items(strat.get("vllm_args"), f"strategy {strategy}.vllm_args")
            + [(flag, f"strategy {strategy}.parallel_flag"), (str(size), "parallel size")],
            env_map(strat.get("env"), f"strategy {strategy}.env"),
        )
    feature_args: list[Item] = []
    feature_env: dict[str, str] = {}
    for name, mode in enabled.items():
        f_args, f_env = feature_block(r, name, mode, gpu)
        feature_args += f_args
        feature_env.update(f_env)
    layers["features"] = (feature_args, feature_env)
    if kv is not None:
        layers["kv_offload"] = (
            items(kv.get("args"), "taxonomy kv_offload.args"),
            env_map(kv.get("env"), "taxonomy kv_offload.env"),
        )
    args, env = _apply(layers, ARG_ORDER, ENV_ORDER)
    return args, (pd.drop_nvl4_env(env, gpu) if role is not None else env)


def _omni_task(r: VllmRecipe, task: str | None) -> tuple[str | None, dict[str, Any]]:
    """The selected omni task (key, entry): the one named, else the first; none declared: {}."""
    tasks = r.omni_tasks
    if task is None:
        return next(iter(tasks.items()), (None, {}))
    if task in tasks:
        return task, tasks[task]
    by_id = [k for k, t in tasks.items() if t.get("id") == task]
    if by_id:
        return by_id[0], tasks[by_id[0]]
    raise RecipeError(f"{r.name}: unknown omni task {task!r} (tasks: {', '.join(tasks) or 'none'})")


def _build_omni(
    r: VllmRecipe, vname: str, gpu: str, task: dict[str, Any]
) -> tuple[list[str], list[str], dict[str, str]]:
    """The site's ``resolveOmniCommand`` (:data:`OMNI_ARG_ORDER`, :data:`OMNI_ENV_ORDER`):
    launcher (with the model), arguments, env. The task's exact-GPU override
    (``omni.tasks[].hardware_overrides.<gpu>``) adds its ``extra_args`` after the task's and may
    swap its ``model_id``."""
    n = r.name
    model = r.data["model"]
    variant = r.variants[vname]
    prof = r.profiles[gpu]
    omni = r.data.get("omni") or {}
    r_ho = r.data.get("hardware_overrides") or {}
    v_ho = variant.get("hardware_overrides") or {}
    extra = (("extra_args",), ("extra_env",))
    tw = f"{n}: omni.tasks.{task.get('key') or task.get('id')}"
    task_ho = (task.get("hardware_overrides") or {}).get(gpu) or {}
    layers: dict[str, Layer] = {
        "base": (
            items(model.get("base_args"), f"{n}: model.base_args"),
            env_map(model.get("base_env"), f"{n}: model.base_env"),
        ),
        "task": (
            items(task.get("extra_args"), f"{tw}.extra_args")
            + items(task_ho.get("extra_args"), f"{tw}.hardware_overrides.{gpu}.extra_args"),
            {},
        ),
        "recipe_generation": _block_layer(
            generation_block(r_ho, prof), f"{n}: hardware_overrides", *extra
        ),
        "variant_generation": _block_layer(
            generation_block(v_ho, prof), f"{n}: variants.{vname}.hardware_overrides", *extra
        ),
        "variant_gpu": _block_layer(
            v_ho.get(gpu), f"{n}: variants.{vname}.hardware_overrides.{gpu}", *extra
        ),
        "omni": ([("--omni", "omni")], {}),
    }
    if vname != "default":
        layers["variant"] = _block_layer(variant, f"{n}: variants.{vname}", *extra)
    if omni.get("port"):
        layers["port"] = (
            [("--port", f"{n}: omni.port"), (str(omni["port"]), f"{n}: omni.port")],
            {},
        )
    args, env = _apply(layers, OMNI_ARG_ORDER, OMNI_ENV_ORDER)
    launcher = str(omni.get("serve_binary") or "vllm serve").split()  # one of LAUNCHERS
    model_id = str(
        task_ho.get("model_id")
        or task.get("model_id")
        or variant.get("model_id")
        or model["model_id"]
    )
    return [*launcher, model_id], args, env


def _kv_option(
    r: VllmRecipe, key: str | None, strategy: str | None, gpu: str
) -> dict[str, Any] | None:
    """The chosen KV-offload option after the site's gates, or None when none is chosen."""
    if key is None:
        return None
    options = r.kv_offload_options
    here = kv_offload_offered(r, gpu, strategy)
    if key not in options:
        raise RecipeError(
            f"{r.name}: unknown KV offload option {key!r} (options: {', '.join(options) or 'none'})"
        )
    if key not in here:
        why = _kv_refusal(r, key, strategy, gpu)
        raise RecipeError(
            f"{r.name}: KV offload {key} is not offered here: {why} "
            f"(options here: {', '.join(here) or 'none'})"
        )
    return dict(options[key])


def _kv_refusal(r: VllmRecipe, key: str, strategy: str | None, gpu: str) -> str | None:
    """Why a KV-offload option is not offered (None when it is)."""
    opt = r.kv_offload_options[key]
    deploy = r.strategies[strategy].get("deploy_type") if strategy else None
    if deploy in ("pd_cluster", "kv_store_lb"):
        return f"not with strategy {strategy} (it sets --kv-transfer-config itself)"
    allow = opt.get("strategies")
    if allow and strategy not in allow:
        with_what = f"strategy {strategy}" if strategy else "a recipe without strategies"
        return f"not with {with_what} (its strategies: {', '.join(allow)})"
    support = (r.data.get("kv_offload_support") or {}).get(key)
    if support == "unsupported":
        return f"the recipe marks it unsupported (kv_offload_support.{key})"
    if opt.get("requires_opt_in") and support != "verified":
        return f"it needs kv_offload_support.{key}: verified in the recipe"
    brands = opt.get("brands")
    brand = r.profiles[gpu].get("brand")
    if brands and brand not in brands:
        return f"not on {gpu} ({brand}; its brands: {', '.join(brands)})"
    return None


def kv_offload_offered(r: VllmRecipe, gpu: str, strategy: str | None) -> list[str]:
    """The KV-offload options of the taxonomy a selection may compose with (none for omni).

    + r: the recipe
    + gpu: the GPU id
    + strategy: the serving strategy (None for a recipe without strategies)
    """
    if r.is_omni:
        return []
    return [k for k in r.kv_offload_options if _kv_refusal(r, k, strategy, gpu) is None]


def _companions(
    r: VllmRecipe, enabled: dict[str, str | None], kv_key: str | None, kv: dict[str, Any] | None
) -> list[Server]:
    """Helper processes that run beside ``vllm serve`` on the same host (no GPU of their own):
    the ``companion`` of each enabled feature, then the KV-offload option's."""
    out: list[tuple[str, str, Any]] = []
    for name in enabled:
        companion = r.features[name].get("companion") or {}
        if companion.get("command"):
            out.append((f"companion-{name}", f"{r.name}: features.{name}.companion", companion))
    if kv is not None and (kv.get("companion") or {}).get("command"):
        out.append((f"companion-kv-{kv_key}", f"kv_offload.{kv_key}.companion", kv["companion"]))
    servers = []
    for role, where, companion in out:
        text = str(companion["command"]).replace("\\\n", " ")
        try:
            argv = shlex.split(text, comments=True)
        except ValueError as e:
            raise RecipeError(f"{where}.command does not split as a shell command ({e})") from None
        if not argv:
            raise RecipeError(f"{where}.command holds no command")
        servers.append(Server(role=role, argv=argv, env={}, npus=0))
    return servers


def _install_names(r: VllmRecipe, install: Any) -> list[str]:
    """Distribution names a ``pip install`` line installs (``uv pip install "lmcache==0.5.1"``)."""
    if not isinstance(install, str):
        return []
    try:
        toks = shlex.split(install)
    except ValueError:
        return []
    if "install" not in toks:
        return []
    reqs = [t for t in toks[toks.index("install") + 1 :] if not t.startswith("-")]
    return [re.split(r"[<>=!~\[;@ ]", req, maxsplit=1)[0] for req in reqs if req]


def _canonical(tok: str) -> str:
    name = flag_name(tok)
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def _parallel_values(args: list[str]) -> dict[str, tuple[str, str]]:
    """The last value of each parallel size flag: kind -> (flag as written, value)."""
    out: dict[str, tuple[str, str]] = {}
    for i, tok in enumerate(args):
        kind = _PARALLEL.get(_canonical(tok)) if is_flag(tok) else None
        if kind is None:
            continue
        if "=" in tok:
            out[kind] = (flag_name(tok), tok.split("=", 1)[1])
        elif i + 1 < len(args) and not is_flag(args[i + 1]):
            out[kind] = (tok, args[i + 1])
    return out


def _with_size(args: list[str], flag: str | None, tp: int | None) -> list[str]:
    """The arguments with an explicit ``--tp`` as the strategy's parallel flag's value, wherever
    a layer left that flag (added at the end when no layer names it)."""
    if tp is None:
        return args
    flag = flag or "--tensor-parallel-size"
    kind = _PARALLEL.get(_canonical(flag))
    out, found = [], False
    i = 0
    while i < len(args):
        tok = args[i]
        same = is_flag(tok) and (
            _canonical(tok) == _canonical(flag) or (kind and _PARALLEL.get(_canonical(tok)) == kind)
        )
        if same and "=" in tok:
            out.append(f"{flag_name(tok)}={tp}")
            found = True
        elif same and i + 1 < len(args) and not is_flag(args[i + 1]):
            out += [tok, str(tp)]
            found = True
            i += 1
        else:
            out.append(tok)
        i += 1
    return out if found else [*out, flag, str(tp)]


def _devices(r: VllmRecipe, gpu: str, args: list[str]) -> int:
    """GPUs the server takes: tensor x data x pipeline parallel size of its final arguments."""
    total = 1
    for flag, value in _parallel_values(args).values():
        try:
            n = int(value)
        except ValueError:
            raise RecipeError(
                f"{r.name}: {flag} {value!r} on {gpu} is not a whole number of GPUs"
            ) from None
        if n < 1:
            raise RecipeError(f"{r.name}: {flag} {value} on {gpu} is not a positive GPU count")
        total *= n
    count = int(r.profiles[gpu]["gpu_count"])
    # A CPU profile's gpu_count is no physical limit (the site does not cap its TP either).
    if total > count and generation(r.profiles[gpu]) != "cpu":
        sizes = " x ".join(f"{f} {v}" for f, v in _parallel_values(args).values())
        raise RecipeError(
            f"{r.name}: the command asks for {total} GPUs ({sizes}) but {gpu} has {count}"
        )
    return total


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
            cfg = load_json_text(raw, "--speculative-config")
        except RecipeError:
            continue
        draft = draft_model(cfg, paths=True)
        if draft is not None and draft not in models:
            models.append(draft)
    return models
