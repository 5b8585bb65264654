"""Multi-node strategies of a vLLM recipe (``deploy_type: multi_node``) as the recipes site
builds them: one ``vllm serve`` per node, rank 0 the head and ranks 1..N-1 its followers, each
with its own argv and the same env on every node (``resolveCommand``'s multi_node branch,
``buildArgs(null, "head" | "worker", rank)``).

Every layer applies as for one node (:mod:`servefleet.kinds.vllm.layers`); only the strategy
layer's parallel arguments (after the strategy's ``vllm_args``) differ, by the strategy's shape
(``G`` GPUs a node, ``N`` nodes, rank ``r``):

+ DEP (parallel flag ``--data-parallel-size``): ``--data-parallel-size G*N
  --data-parallel-size-local G --data-parallel-address $HEAD_IP``, a follower adds
  ``--data-parallel-start-rank r*L`` (``L``: the last ``--data-parallel-size-local`` of the
  recipe's ``strategy_overrides.<s>`` arguments and their hardware blocks, else ``G``). No
  ``--headless``: every node serves HTTP (hybrid load balancing).
+ ``parallelism: tp_pp``: ``--tensor-parallel-size G --pipeline-parallel-size N`` and the
  rendezvous.
+ ``parallelism: tp_dp``: ``--tensor-parallel-size G --data-parallel-size N
  --data-parallel-size-local 1 --data-parallel-address $HEAD_IP``, a follower adds
  ``--data-parallel-start-rank r``.
+ otherwise (TP, TEP): ``--tensor-parallel-size G*N`` and the rendezvous.

The rendezvous (vLLM's mp backend): ``--nnodes N --node-rank r --master-addr $HEAD_IP``, and
``--headless`` on a follower. ``$HEAD_IP`` and the strategy env's ``$IFACE_NAME`` stay
placeholders until a host plan binds them (:func:`servefleet.kinds.roles.bind_group`).

The node count is the site's (at least 2, more where ``strategy_min_gpus`` needs them), grown
where the variant's ``vram_minimum_gb`` needs more nodes (the site would print a command that
cannot hold the model, as servefleet refuses for one node): :func:`node_floor`. A selection may
ask for more, up to the site's :data:`~servefleet.kinds.vllm.hardware.MAX_NODES`; fewer than
the floor is refused. Hardware that does not scale out (``scalable: false``) runs none. Pure.
"""

from __future__ import annotations

import math
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.roles import HEAD_IP, MAIN, last_value
from servefleet.kinds.vllm.hardware import (
    MAX_NODES,
    generation_block,
    min_gpus,
    nodes_needed,
    strategy_on,
)
from servefleet.kinds.vllm.layers import build_layers
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.kinds.vllm.sizing import rank_devices
from servefleet.kinds.vllm.words import Item, items, words
from servefleet.spec import Server

HEAD = f"${HEAD_IP}"  # the rendezvous and DP coordinator address, as the site spells it
DP_LOCAL = "--data-parallel-size-local"


def is_multi_node(r: VllmRecipe, strategy: str | None) -> bool:
    """Whether a strategy of the recipe spans several nodes (``deploy_type: multi_node``).

    + r: the recipe
    + strategy: the strategy (None: a recipe without strategies)
    """
    return bool(strategy) and r.strategies[str(strategy)].get("deploy_type") == "multi_node"


def multi_node_strategies(r: VllmRecipe, gpu: str) -> list[str]:
    """The recipe's compatible multi-node strategies on this GPU (none on hardware that does
    not scale out), whatever their node count.

    + r: the recipe
    + gpu: the GPU id
    """
    if r.profiles[gpu].get("scalable") is False:
        return []
    return [s for s in r.compatible_strategies if is_multi_node(r, s) and strategy_on(r, s, gpu)]


def node_floor(r: VllmRecipe, vname: str, strategy: str, gpu: str) -> int:
    """The fewest nodes of this GPU the strategy runs the variant on (see the module's text).

    + r: the recipe
    + vname: the variant
    + strategy: a multi-node strategy
    + gpu: the GPU id
    """
    return nodes_needed(r, vname, strategy, gpu)


def _floor_reason(r: VllmRecipe, vname: str, strategy: str, gpu: str) -> str:
    """What sets the floor, for messages."""
    prof = r.profiles[gpu]
    count = int(prof["gpu_count"])
    why = ["a group has 2 nodes at least"]
    floor = min_gpus(r, strategy, gpu)
    if math.ceil(floor / (count or 8)) > 2:
        by = math.ceil(floor / (count or 8))
        why.append(f"strategy_min_gpus {floor:g} at {count} GPUs a node: {by} nodes")
    need, have = r.variants[vname].get("vram_minimum_gb") or 0, prof.get("vram_gb") or 0
    if need > 0 and have > 0 and math.ceil(need / have) > 2:
        by = math.ceil(need / have)
        why.append(
            f"variant {vname}'s {need:g} GB (vram_minimum_gb) at {have:g} GB a node: {by} nodes"
        )
    return "; ".join(why)


def node_count(r: VllmRecipe, vname: str, strategy: str, gpu: str, nodes: Any) -> int:
    """The nodes the selection spans: ``nodes`` when given (checked against the floor and the
    site's limit), else :func:`node_floor`; hardware that does not scale out is refused.

    + r: the recipe
    + vname: the variant
    + strategy: a multi-node strategy
    + gpu: the GPU id
    + nodes: the node count asked for (None: the floor)
    """
    if r.profiles[gpu].get("scalable") is False:
        raise RecipeError(
            f"{r.name}: {gpu} does not scale out (scalable: false), so {strategy} cannot span "
            "nodes there; allowed: a single-node strategy"
        )
    floor = node_floor(r, vname, strategy, gpu)
    reason = _floor_reason(r, vname, strategy, gpu)
    if floor > MAX_NODES:
        raise RecipeError(
            f"{r.name}: {strategy} on {gpu} needs {floor} nodes ({reason}), more than the "
            f"{MAX_NODES} the recipes site offers"
        )
    if nodes is None:
        return floor
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not floor <= nodes <= MAX_NODES:
        plain = isinstance(nodes, int) and not isinstance(nodes, bool)
        shown = nodes if plain else repr(str(nodes)[:40])
        raise RecipeError(
            f"{r.name}: a node count of {shown} for {strategy} on {gpu}, which takes at least {floor} "
            f"({reason}) and at most the recipes site's {MAX_NODES}; allowed: "
            f"{floor}..{MAX_NODES}"
        )
    return nodes


def _override_words(r: VllmRecipe, strategy: str, gpu: str) -> list[str]:
    """The argument words of ``strategy_overrides.<s>``, then its generation's and its exact
    GPU's hardware blocks: where the site reads a DEP node's local rank count."""
    n = r.name
    so = (r.data.get("strategy_overrides") or {}).get(strategy) or {}
    ho = so.get("hardware_overrides") or {}
    w = f"{n}: strategy_overrides.{strategy}"
    gen = generation_block(ho, r.profiles[gpu]) or {}
    exact = ho.get(gpu) or {}
    seq: list[Item] = [
        *items(so.get("vllm_args"), f"{w}.vllm_args"),
        *items(so.get("extra_args"), f"{w}.extra_args"),
        *items(gen.get("extra_args"), f"{w}.hardware_overrides.extra_args"),
        *items(exact.get("extra_args"), f"{w}.hardware_overrides.{gpu}.extra_args"),
    ]
    return words(seq)


def dp_local(r: VllmRecipe, strategy: str, gpu: str) -> int:
    """A DEP node's data-parallel ranks, as the site offsets a follower's start rank by: the
    recipe's ``--data-parallel-size-local`` for the strategy, else the node's GPUs.

    + r: the recipe
    + strategy: a multi-node DEP strategy
    + gpu: the GPU id
    """
    raw = last_value(_override_words(r, strategy, gpu), DP_LOCAL)
    if raw is None:
        return int(r.profiles[gpu]["gpu_count"])
    if not raw.isdigit() or int(raw) < 1:
        raise RecipeError(
            f"{r.name}: strategy_overrides.{strategy}: {DP_LOCAL} {raw[:40]!r} is not a rank "
            "count; allowed: a positive whole number"
        )
    return int(raw)


def rank_items(r: VllmRecipe, strategy: str, gpu: str, nodes: int, rank: int) -> list[Item]:
    """The strategy layer's parallel arguments of one rank (see the module's text).

    + r: the recipe
    + strategy: a multi-node strategy
    + gpu: the GPU id
    + nodes: the group's node count
    + rank: the rank, ``0..nodes-1``
    """
    strat = r.strategies[strategy]
    count = int(r.profiles[gpu]["gpu_count"])
    flag = strat.get("parallel_flag") or "--tensor-parallel-size"
    shape = strat.get("parallelism")
    rendezvous = ["--nnodes", str(nodes), "--node-rank", str(rank), "--master-addr", HEAD]
    rendezvous += ["--headless"] if rank > 0 else []
    out: list[str]
    if flag == "--data-parallel-size":
        out = ["--data-parallel-size", str(count * nodes), DP_LOCAL, str(count)]
        out += ["--data-parallel-address", HEAD]
        if rank > 0:
            out += ["--data-parallel-start-rank", str(rank * dp_local(r, strategy, gpu))]
    elif shape == "tp_pp":
        out = ["--tensor-parallel-size", str(count), "--pipeline-parallel-size", str(nodes)]
        out += rendezvous
    elif shape == "tp_dp":
        out = ["--tensor-parallel-size", str(count), "--data-parallel-size", str(nodes)]
        out += [DP_LOCAL, "1", "--data-parallel-address", HEAD]
        if rank > 0:
            out += ["--data-parallel-start-rank", str(rank)]
    else:
        out = ["--tensor-parallel-size", str(count * nodes), *rendezvous]
    where = f"{r.name}: {strategy} rank {rank} of {nodes}"
    return [(tok, where) for tok in out]


def group_servers(
    r: VllmRecipe,
    vname: str,
    strategy: str,
    gpu: str,
    nodes: int,
    enabled: dict[str, str | None],
    kv: dict[str, Any] | None,
) -> list[Server]:
    """One ``main`` server per rank, ``0..nodes-1``: the layers with the rank's parallel
    arguments, each taking the GPUs of its node that its arguments ask for.

    + r: the recipe
    + vname: the variant
    + strategy: a multi-node strategy
    + gpu: the GPU id
    + nodes: the node count (:func:`node_count`)
    + enabled: the enabled features and their modes
    + kv: the composing KV-offload option, or None
    """
    model_id = str(r.variants[vname].get("model_id") or r.data["model"]["model_id"])
    servers = []
    for rank in range(nodes):
        parallel = rank_items(r, strategy, gpu, nodes, rank)
        args, env = build_layers(r, vname, strategy, gpu, 0, enabled, kv, parallel=parallel)
        npus = rank_devices(r, gpu, args, nodes, rank)
        argv = ["vllm", "serve", model_id, *args]
        servers.append(Server(role=MAIN, argv=argv, env=env, npus=npus, rank=rank))
    return servers
