"""Prefill/decode pools of a vLLM recipe's ``pd_cluster`` strategy, as the recipes site builds
them (``resolveCommand``'s pd_cluster branch, one node per pool).

A pool's parallelism (``tp``, ``tep``, ``dep``) is one the recipe offers (:func:`pool_modes`):
the one chosen, else the role's own (``strategy_overrides.pd_cluster.<role>.parallelism``, then
the strategy's ``<role>.parallelism``), else ``tp``; one the recipe does not offer falls to its
first, as on the site. Its arguments follow the role's ``vllm_args``: ``tp``/``tep`` the
parallel flag with the node's GPUs (``tep`` adds ``--enable-expert-parallel``), ``dep`` the
data-parallel layout of one node with the pool's first node as coordinator. Each role takes
every GPU of its node (``CUDA_VISIBLE_DEVICES``). Pure.
"""

from __future__ import annotations

import re
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.kinds.roles import ROUTER_POLICIES, dp_rpc_port, node
from servefleet.kinds.vllm.recipe import VllmRecipe
from servefleet.kinds.vllm.words import Item

POOL_MODES = ("tp", "tep", "dep")
# The site keeps these env keys of a pd_cluster role only on GB200/GB300 NVL4 trays
# (NCCL symmetric memory, cross-node NVLink, UCX devices): elsewhere they are dropped.
NVL4_ONLY_ENV = (
    "VLLM_USE_NCCL_SYMM_MEM",
    "NCCL_CUMEM_ENABLE",
    "NCCL_MNNVL_ENABLE",
    "NCCL_NVLS_ENABLE",
    "UCX_NET_DEVICES",
)
NVL4_HARDWARE = ("gb200", "gb300")


def is_pd(r: VllmRecipe, strategy: str | None) -> bool:
    """Whether a strategy of the recipe is a prefill/decode cluster (``deploy_type``)."""
    return bool(strategy) and r.strategies[str(strategy)].get("deploy_type") == "pd_cluster"


def pool_modes(r: VllmRecipe) -> list[str]:
    """The pool parallelisms the recipe offers: the families of its other compatible strategies
    (``*_tp``, ``*_tp_pp``, ``*_tp_dp``: tp; ``*_tep``: tep; ``*_dep``: dep), ``tp`` when none,
    narrowed by ``strategy_overrides.pd_cluster.pool_modes`` unless that leaves none.

    + r: the recipe
    """
    found = set()
    for s in r.compatible_strategies:
        if is_pd(r, s):
            continue
        if re.search(r"(?:^|_)dep\Z", s):
            found.add("dep")
        elif re.search(r"(?:^|_)tep\Z", s):
            found.add("tep")
        elif re.search(r"(?:^|_)tp(?:_pp|_dp)?\Z", s):
            found.add("tp")
    modes = [m for m in POOL_MODES if m in (found or {"tp"})]
    narrow = _so(r, "pd_cluster").get("pool_modes")
    if isinstance(narrow, list) and narrow:
        kept = [m for m in modes if m in narrow]
        modes = kept or modes
    return modes


def _so(r: VllmRecipe, strategy: str) -> dict[str, Any]:
    return (r.data.get("strategy_overrides") or {}).get(strategy) or {}


def role_config(r: VllmRecipe, strategy: str, role: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A role's blocks: the recipe's ``strategy_overrides.<s>.<role>`` and the strategy's
    ``<role>``."""
    return _so(r, strategy).get(role) or {}, r.strategies[strategy].get(role) or {}


def parallelism(r: VllmRecipe, strategy: str, role: str, chosen: str | None) -> str:
    """The parallelism of a role's pool (see the module's text).

    + r: the recipe
    + strategy: the pd_cluster strategy
    + role: ``prefill`` or ``decode``
    + chosen: the one the selection names (checked against :func:`pool_modes`), or None
    """
    modes = pool_modes(r)
    if chosen is not None:
        if chosen not in modes:
            raise RecipeError(
                f"{r.name}: pool parallelism {chosen!r} is not offered by {strategy} "
                f"(allowed: {', '.join(modes)})"
            )
        return chosen
    own, base = role_config(r, strategy, role)
    picked = own.get("parallelism") or base.get("parallelism") or "tp"
    return str(picked) if picked in modes else modes[0]


def _role_tp(r: VllmRecipe, strategy: str, role: str) -> int | None:
    own, base = role_config(r, strategy, role)
    raw = own.get("tp", base.get("tp"))
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise RecipeError(
            f"{r.name}: strategy_overrides.{strategy}.{role}.tp {str(raw)[:40]!r} is not a "
            "GPU count; allowed: a positive whole number"
        )
    return raw


def dp_local(r: VllmRecipe, strategy: str, role: str, mode: str, gpu_count: int) -> int:
    """A DEP pool's data-parallel ranks on one node (``gpu_count / tp``); 0 for tp/tep."""
    if mode != "dep":
        return 0
    return max(1, gpu_count // (_role_tp(r, strategy, role) or 1))


def pool_items(r: VllmRecipe, strategy: str, role: str, mode: str, gpu_count: int) -> list[Item]:
    """The pool's arguments (after the role's ``vllm_args``), one node per pool.

    + r: the recipe
    + strategy: the pd_cluster strategy
    + role: ``prefill`` or ``decode``
    + mode: its parallelism
    + gpu_count: GPUs of one node
    """
    where = f"{r.name}: {strategy} {role} pool ({mode})"
    own, base = role_config(r, strategy, role)
    out: list[str] = []
    if mode == "dep":
        tp = _role_tp(r, strategy, role)
        local = dp_local(r, strategy, role, mode, gpu_count)
        if tp is not None:
            out += ["--tensor-parallel-size", str(tp)]
        out += ["--data-parallel-size", str(local), "--data-parallel-size-local", str(local)]
        out += ["--data-parallel-start-rank", "0"]
        out += ["--data-parallel-address", node(role), "--data-parallel-rpc-port"]
        out += [dp_rpc_port(role), "--enable-expert-parallel"]
    else:
        flag = (
            own.get("parallel_flag")
            or base.get("parallel_flag")
            or r.strategies[strategy].get("parallel_flag")
            or "--tensor-parallel-size"
        )
        out += [str(flag), str(max(1, gpu_count))]
        if mode == "tep":
            out.append("--enable-expert-parallel")
    return [(tok, where) for tok in out]


def pool_env(gpu_count: int) -> dict[str, str]:
    """A role that owns its node takes all of its GPUs."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpu_count))}


def drop_nvl4_env(env: dict[str, str], gpu: str) -> dict[str, str]:
    """The env without the NVL4-only keys, except on GB200/GB300."""
    if gpu in NVL4_HARDWARE:
        return env
    return {k: v for k, v in env.items() if k not in NVL4_ONLY_ENV}


def router_policy(r: VllmRecipe, strategy: str) -> str:
    """The router's ``--policy``: the strategy's ``router.policy``, else ``round_robin``."""
    policy = (r.strategies[strategy].get("router") or {}).get("policy") or "round_robin"
    if policy not in ROUTER_POLICIES:
        raise RecipeError(
            f"strategy {strategy}: router.policy {str(policy)[:40]!r} is not a vllm-router "
            f"policy (allowed: {', '.join(ROUTER_POLICIES)})"
        )
    return str(policy)


def intra_node_dp(r: VllmRecipe, strategy: str, locals_: list[int]) -> int:
    """``--intra-node-data-parallel-size``: the recipe's
    ``strategy_overrides.<s>.router.intra_node_data_parallel_size``, else the larger DEP pool's
    local ranks, at least 1."""
    raw = (_so(r, strategy).get("router") or {}).get("intra_node_data_parallel_size")
    if raw is None:
        return max([*locals_, 1])
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise RecipeError(
            f"{r.name}: strategy_overrides.{strategy}.router.intra_node_data_parallel_size "
            f"{str(raw)[:40]!r} is not a rank count; allowed: a positive whole number"
        )
    return raw
