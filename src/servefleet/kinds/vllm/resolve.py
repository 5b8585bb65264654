"""Resolve a selection of a vLLM recipe to one host's ``vllm serve`` argv and env, or to a
group's: one server per rank of a multi-node strategy.

The selection's axes (hardware, variant, strategy, features, KV offload, an omni task, a
pd_cluster's pool parallelism, a multi-node strategy's node count) are checked and defaulted
here; the arguments and env come from the layer engine (:mod:`servefleet.kinds.vllm.layers`),
an omni recipe's from :mod:`servefleet.kinds.vllm.omni`, a multi-node rank's parallel arguments
and node count from :mod:`servefleet.kinds.vllm.multinode`, the KV-offload option from
:mod:`servefleet.kinds.vllm.kv_offload`, the helper processes from
:mod:`servefleet.kinds.vllm.companions` and the GPUs a server takes from
:mod:`servefleet.kinds.vllm.sizing`.

A recipe without strategies renders its base command: the layers without the strategy ones
(the GPUs it takes come from its own arguments, 1 when they name none). An omni recipe
renders as the site's ``resolveOmniCommand``.

Refused on purpose (the site prints a command that cannot start there): a variant whose
``vram_minimum_gb`` exceeds the node's ``vram_gb`` (no single-node command; the message names
the multi-node strategies that would fit), a strategy whose ``hardware_match`` GPU range or
``strategy_min_gpus`` floor excludes the hardware, and a command asking for more GPUs than the
host has (tensor x data x pipeline parallel size; CPU hardware is not capped). A feature's or
the KV-offload option's ``companion`` runs as a second server beside it (not beside a
pd_cluster's roles or a multi-node group's ranks: the site renders none there, so a selection
enabling one is refused).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.base import draft_model
from servefleet.kinds.loader import load_json_text
from servefleet.kinds.roles import PD_ROLES, pd_router
from servefleet.kinds.vllm import pd
from servefleet.kinds.vllm.companions import companions
from servefleet.kinds.vllm.features import parse_features, select_features
from servefleet.kinds.vllm.hardware import (
    default_hardware,
    default_strategy,
    default_variant,
    fits_one_node,
    gpu_shortfall,
    offered_hardware,
    parallel_size,
    single_node,
    single_node_strategies,
    strategy_on,
    too_big_for_one_node,
    variant_runs,
)
from servefleet.kinds.vllm.kv_offload import install_names, kv_option
from servefleet.kinds.vllm.layers import build_layers
from servefleet.kinds.vllm.multinode import (
    group_servers,
    is_multi_node,
    multi_node_strategies,
    node_count,
)
from servefleet.kinds.vllm.omni import build_omni, omni_task
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.kinds.vllm.sizing import devices, with_size
from servefleet.spec import Requirements, Server, ServeSpec


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
    nodes: int | None = None,
    one_host: bool = False,
) -> ServeSpec:
    """Resolve a selection of a vLLM recipe to the ``vllm serve`` argv and env of one host, or,
    for a ``pd_cluster`` strategy, of its prefill and decode roles and the router in front, or,
    for a ``multi_node`` strategy, of each rank of its group (``ServeSpec.nodes`` servers, rank
    0 the head; ``$HEAD_IP`` and ``$IFACE_NAME`` left for a host plan to bind).

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
    + nodes: ``multi_node`` only: the nodes the group spans (default: the fewest it runs on,
      :func:`servefleet.kinds.vllm.multinode.node_floor`)
    + one_host: refuse a ``multi_node`` strategy, as one host cannot serve it (the deploy path,
      until a host plan places groups)
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
        _no_nodes(r, None, hardware, nodes)
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
    if not is_multi_node(r, strategy):
        _no_nodes(r, strategy, hardware, nodes)
    if pd.is_pd(r, strategy):
        return _resolve_pd(
            r, variant, hardware, strategy, tp, features, no_features, kv_offload, pool_parallelism
        )
    if is_multi_node(r, strategy) and not one_host:
        return _resolve_group(
            r, variant, hardware, strategy, tp, nodes, features, no_features, kv_offload
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
    kv = kv_option(r, kv_offload, strategy, hardware)
    flag = str(r.strategies[strategy].get("parallel_flag") or "--tensor-parallel-size")
    args, env = build_layers(r, variant, strategy, hardware, size, enabled, kv)
    model_id = str(r.variants[variant].get("model_id") or r.data["model"]["model_id"])
    return _spec(
        r,
        {"hardware": hardware, "strategy": strategy, "variant": variant},
        enabled,
        kv_offload,
        ["vllm", "serve", model_id],
        with_size(args, flag, tp),
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
    kv_option(r, kv_offload, strategy, hardware)
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
    _no_companions(r, strategy, enabled, None)
    count = int(r.profiles[hardware]["gpu_count"])
    model_id = str(r.variants[variant].get("model_id") or r.data["model"]["model_id"])
    servers, modes, locals_ = [], [], []
    for role in PD_ROLES:
        mode = pd.parallelism(r, strategy, role, chosen)
        args, env = build_layers(r, variant, strategy, hardware, count, enabled, None, role, mode)
        servers.append(
            Server(
                role=role,
                argv=["vllm", "serve", model_id, *args],
                env=env,
                npus=devices(r, hardware, args),
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


def _resolve_group(
    r: VllmRecipe,
    variant: str,
    hardware: str,
    strategy: str,
    tp: int | None,
    nodes: int | None,
    features: list[str],
    no_features: list[str],
    kv_offload: str | None,
) -> ServeSpec:
    """A ``multi_node`` selection: one server per rank of its group
    (:mod:`servefleet.kinds.vllm.multinode`). Refused: ``--tp`` (the node count sizes it), a
    feature or KV-offload option that runs a companion (the site renders none beside a rank),
    a node count below the floor or above the site's limit, and hardware that does not scale
    out."""
    if tp is not None:
        raise RecipeError(
            f"{r.name}: --tp sizes a single-node strategy; {strategy} takes every GPU of each "
            "of its nodes (allowed: a node count)"
        )
    count = node_count(r, variant, strategy, hardware, nodes)
    enabled = select_features(r, variant, strategy, hardware, features, no_features)
    kv = kv_option(r, kv_offload, strategy, hardware)
    _no_companions(r, strategy, enabled, kv_offload, kv)
    group = group_servers(r, variant, strategy, hardware, count, enabled, kv)
    head = group[0]
    selection = {"hardware": hardware, "strategy": strategy, "variant": variant}
    launcher = head.argv[:3]
    return _spec(r, selection, enabled, kv_offload, launcher, head.argv[3:], head.env, kv, group)


def _no_nodes(r: VllmRecipe, strategy: str | None, hardware: str, nodes: int | None) -> None:
    """A node count is refused for a strategy of one node (or a pd_cluster's one-node pools)."""
    if nodes is None:
        return
    multi = multi_node_strategies(r, hardware)
    raise RecipeError(
        f"{r.name}: a node count ({str(nodes)[:40]}) sizes a multi-node strategy; "
        f"{strategy or 'a recipe without strategies'} runs on one node (multi-node strategies "
        f"on {hardware}: {', '.join(multi) or 'none'})"
    )


def _no_companions(
    r: VllmRecipe,
    strategy: str,
    enabled: dict[str, str | None],
    kv_key: str | None,
    kv: dict[str, Any] | None = None,
) -> None:
    """A feature's or the KV-offload option's companion is refused where the site renders none
    (a pd_cluster's roles, a multi-node group's ranks)."""
    helpers = [f for f in enabled if (r.features[f].get("companion") or {}).get("command")]
    if helpers:
        raise RecipeError(
            f"{r.name}: feature {helpers[0]} runs a companion beside its server, which "
            f"{strategy} does not render; allowed: --no-feature {helpers[0]}"
        )
    if kv is not None and (kv.get("companion") or {}).get("command"):
        raise RecipeError(
            f"{r.name}: KV offload {kv_key} runs a companion beside its server, which "
            f"{strategy} does not render; allowed: no --kv-offload, or another option"
        )


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
        kv = kv_option(r, kv_offload, None, hardware)
        args, env = build_layers(r, variant, None, hardware, 0, enabled, kv)
        model_id = str(r.variants[variant].get("model_id") or r.data["model"]["model_id"])
        launcher = ["vllm", "serve", model_id]
        return _spec(
            r, selection, enabled, kv_offload, launcher, with_size(args, None, tp), env, kv
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
    key, spec = omni_task(r, task)
    if key is not None:
        selection["task"] = key
    launcher, args, env = build_omni(r, variant, hardware, spec)
    return _spec(r, selection, {}, None, launcher, with_size(args, None, tp), env, None)


def _spec(
    r: VllmRecipe,
    selection: dict[str, str],
    enabled: dict[str, str | None],
    kv_offload: str | None,
    launcher: list[str],
    args: list[str],
    env: dict[str, str],
    kv: dict[str, Any] | None,
    group: list[Server] | None = None,
) -> ServeSpec:
    """The spec of one main server (``launcher`` + ``args``) and its companions, or of a
    multi-node ``group``'s ranks (``args``: rank 0's, which names the models)."""
    gpu = selection["hardware"]
    selection["features"] = ",".join(n if m is None else f"{n}={m}" for n, m in enabled.items())
    if kv is not None and kv_offload is not None:
        selection["kv_offload"] = kv_offload
    if group is None:
        npus = devices(r, gpu, args)
        servers = [Server(role="main", argv=[*launcher, *args], env=env, npus=npus)]
        servers += companions(r, enabled, kv_offload, kv)
    else:
        servers = group
    packages = install_names(r, kv.get("install")) if kv is not None else []
    return ServeSpec(
        recipe=r.name,
        kind="vllm",
        selection=selection,
        servers=servers,
        requirements=Requirements(packages=packages, models=_models(launcher[-1], args)),
        compile_fingerprint=None,
        nodes=len(servers) if group is not None else 1,
    )


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
