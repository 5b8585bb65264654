"""Resolve a selection of an RBLN recipe card into the exact argv and env of each server.

Order of work (issue 2):

1. Strategy (default: the first) and target (default ``Latency``, case-insensitive) pick an option.
2. Selection: each mode axis defaults to ``off`` if offered, else its first value; each option
   axis to ``option_base[axis]``. ``recommended`` overlays the defaults; ``sets`` override both.
   Only ``grid.modes``/``grid.options`` are offered; the card's display ``axes`` name more.
3. A selection matching every pair of an ``excluded`` entry is refused.
4. Per role: the base args/envs in the card's order, then the delta of each selected value that
   has one, axes in the order of ``modes`` then ``options``; within a delta deletions come before
   additions; an added key that exists keeps its place, a new key is appended.
5. argv = launcher + model + the args' tokens; requirements and the compile fingerprint are
   derived from the resolved argv/env.
6. Prefill/decode roles: each must hand KV over (``--kv-transfer-config`` with a
   ``kv_connector``, ``kv_role`` ``kv_producer`` on prefill and ``kv_consumer`` on decode, or
   ``kv_both``); the spec gets the router in front of them (the grid's ``router.policy``, else
   ``round_robin``), placeholders left as the card writes them (:mod:`servefleet.kinds.roles`).
"""

from __future__ import annotations

from collections.abc import Mapping

from servefleet.base.errors import RecipeError
from servefleet.kinds.base import draft_model
from servefleet.kinds.rbln.argv_scan import json_flag, scan_argv
from servefleet.kinds.rbln.card_schema import Card, Grid, Option, Strategy
from servefleet.kinds.rbln.defaults import default_compiler_version as pinned
from servefleet.kinds.rbln.fingerprint import compile_fingerprint
from servefleet.kinds.roles import DECODE, PD_ROLES, PREFILL, pd_router
from servefleet.spec import Requirements, Server, ServeSpec


def default_compiler_version() -> str:
    """The default data's ``rebel-compiler`` pin (the RBLN kind's defaults)."""
    return pinned()


def pick_strategy(card: Card, strategy: str | None) -> Strategy:
    """The strategy by slug (default: the card's first).

    + card: the loaded card
    + strategy: a slug, or None
    """
    if strategy is None:
        return card.strategies[0]
    for s in card.strategies:
        if s.slug == strategy:
            return s
    allowed = ", ".join(s.slug for s in card.strategies)
    raise RecipeError(f"{card.name}: unknown strategy {strategy!r} (allowed: {allowed})")


def pick_option(card: Card, strategy: Strategy, target: str) -> Option:
    """The option of a strategy for a target (case-insensitive).

    + card: the loaded card (named in errors)
    + strategy: the chosen strategy
    + target: ``Latency``/``Throughput`` in any case
    """
    for opt in strategy.options:
        if opt.target.lower() == target.lower():
            return opt
    allowed = ", ".join(o.target for o in strategy.options)
    raise RecipeError(
        f"{card.name}: strategy {strategy.slug} has no target {target!r} (allowed: {allowed})"
    )


def _offered_text(grid: Grid) -> str:
    return "; ".join(f"{a}: {', '.join(v)}" for a, v in grid.offered().items()) or "none"


def default_selection(grid: Grid, *, recommended: bool = False) -> dict[str, str]:
    """Defaults of every offered axis (modes first, then options), with ``recommended`` on top.

    + grid: the option's grid
    + recommended: overlay ``grid.recommended``
    """
    sel = {axis: ("off" if "off" in values else values[0]) for axis, values in grid.modes.items()}
    sel.update({axis: grid.option_base[axis] for axis in grid.options})
    if recommended:
        sel.update(grid.recommended)
    return sel


def check_set(card: Card, grid: Grid, axis: str, value: str) -> None:
    """Refuse an axis or value the grid does not offer, saying whether the card only shows it.

    + card: the card (its display ``axes`` and name)
    + grid: the option's grid
    + axis: the axis to set
    + value: the value to set
    """
    offered = grid.offered()
    if axis not in offered:
        shown = " is shown on the card but" if axis in card.axes else ""
        raise RecipeError(
            f"{card.name}: axis {axis!r}{shown} is not offered by this grid "
            f"(offered: {_offered_text(grid)})"
        )
    if value not in offered[axis]:
        shown = " is shown on the card but" if value in card.axes.get(axis, []) else ""
        raise RecipeError(
            f"{card.name}: {axis}={value!r}{shown} is not offered by this grid "
            f"(allowed {axis}: {', '.join(offered[axis])})"
        )


def select(
    card: Card, grid: Grid, *, sets: Mapping[str, str] | None = None, recommended: bool = False
) -> dict[str, str]:
    """The full selection: defaults, then ``recommended``, then ``sets``; excluded is refused.

    + card: the card
    + grid: the option's grid
    + sets: axis -> value overrides
    + recommended: overlay the grid's recommended values first
    """
    sel = default_selection(grid, recommended=recommended)
    for axis, value in (sets or {}).items():
        check_set(card, grid, axis, value)
        sel[axis] = value
    for entry in grid.excluded:
        if all(sel.get(a) == v for a, v in entry.items()):
            combo = ", ".join(f"{a}={v}" for a, v in entry.items())
            raise RecipeError(f"{card.name}: the combination {combo} is excluded by the recipe")
    return sel


def build_servers(grid: Grid, sel: Mapping[str, str], npus: int) -> list[Server]:
    """Apply the base and the selected deltas to each role.

    + grid: the option's grid
    + sel: the full selection
    + npus: devices per server
    """
    servers = []
    order = list(grid.modes) + list(grid.options)
    for role in grid.base:
        args = {k: list(v) for k, v in role.args.items()}
        envs = dict(role.envs)
        for axis in order:
            delta = grid.deltas.get(f"{axis}={sel[axis]}", {}).get(role.role)
            if delta is None:
                continue
            for key in delta.del_args:
                args.pop(key, None)
            for key in delta.del_envs:
                envs.pop(key, None)
            for key, tokens in delta.add_args.items():
                args[key] = list(tokens)
            envs.update(delta.add_envs)
        argv = [*role.launcher, grid.model]
        for tokens in args.values():
            argv.extend(tokens)
        servers.append(Server(role=role.role, argv=argv, env=envs, npus=npus))
    return servers


def requirements(servers: list[Server], model: str) -> Requirements:
    """What the resolved servers need: vllm-rbln extras, packages, imports and models.

    + servers: the resolved servers
    + model: the served model
    """
    extras: list[str] = []
    packages: list[str] = []
    imports = ["rebel", "vllm_rbln"]
    models = [model]
    for server in servers:
        scanned = scan_argv(server.argv)
        kv = json_flag(scanned, "kv-transfer-config")
        connector = str((kv or {}).get("kv_connector", ""))
        # lmcache-rbln and nixl-rbln come with the kv-connectors extra (rbln.md §3.2)
        if ("LMCache" in connector or connector.startswith("RblnNixl")) and (
            "kv-connectors" not in extras
        ):
            extras.append("kv-connectors")
        if "LMCache" in connector and "lmcache_rbln" not in imports:
            imports.append("lmcache_rbln")
        spec = json_flag(scanned, "speculative-config") or {}
        if spec.get("method") == "suffix" and "arctic-inference" not in packages:
            packages.append("arctic-inference")
            imports.append("arctic_inference")
        draft = draft_model(spec)
        if draft is not None and draft not in models:
            models.append(draft)
    return Requirements(vllm_rbln_extras=extras, packages=packages, imports=imports, models=models)


def resolve_rbln(
    card: Card,
    *,
    target: str = "Latency",
    strategy: str | None = None,
    sets: Mapping[str, str] | None = None,
    recommended: bool = False,
    sku: str | None = None,
    compiler_version: str | None = None,
) -> ServeSpec:
    """Resolve one selection of an RBLN card.

    + card: the loaded card
    + target: ``Latency`` (default) or ``Throughput``, case-insensitive
    + strategy: strategy slug (default: the card's first)
    + sets: axis -> value overrides (``{"lmcache": "cpu"}``)
    + recommended: start from the grid's recommended values
    + sku: the NPU SKU (default: the option's first; must be one the option lists)
    + compiler_version: rebel-compiler version (default: the deploy's pin)
    """
    strat = pick_strategy(card, strategy)
    opt = pick_option(card, strat, target)
    grid = opt.grid
    sel = select(card, grid, sets=sets, recommended=recommended)
    if sku is None:
        sku = opt.skus[0]
    elif sku not in opt.skus:
        raise RecipeError(
            f"{card.name}: SKU {sku!r} is not one this option is verified on "
            f"(allowed: {', '.join(opt.skus)})"
        )
    servers = build_servers(grid, sel, opt.npus)
    router = _pd_router(card, grid, servers)
    version = compiler_version or default_compiler_version()
    prints = [compile_fingerprint(s.argv, s.env, s.npus, sku, version) for s in servers]
    selection = dict(sel)
    selection.update(target=opt.target, strategy=strat.slug, sku=sku)
    return ServeSpec(
        recipe=card.name,
        kind="rbln",
        selection=selection,
        servers=servers,
        requirements=requirements(servers, grid.model),
        compile_fingerprint=prints[0] if len(prints) == 1 else _combine(prints),
        skus=list(opt.skus),
        router=router,
    )


# The kv_role each role of a prefill/decode pair may take (kv_both: the proxy assigns it)
KV_ROLES = {PREFILL: ("kv_producer", "kv_both"), DECODE: ("kv_consumer", "kv_both")}


def _pd_router(card: Card, grid: Grid, servers: list[Server]) -> list[str]:
    """The router in front of prefill/decode roles (none for one role), once each role is seen
    to hand its KV over."""
    by_role = {s.role: s for s in servers}
    if sorted(by_role) != sorted(PD_ROLES):
        return []
    for role, allowed in KV_ROLES.items():
        kv = json_flag(scan_argv(by_role[role].argv), "kv-transfer-config") or {}
        if not kv.get("kv_connector") or kv.get("kv_role") not in allowed:
            found = f"kv_role {kv.get('kv_role')!r}" if kv else "no --kv-transfer-config"
            raise RecipeError(
                f"{card.name}: role {role} has {found}; allowed: a --kv-transfer-config naming "
                f"a kv_connector and kv_role {' or '.join(allowed)}"
            )
    return pd_router(grid.router or "round_robin", by_role[PREFILL], by_role[DECODE])


def _combine(prints: list[str]) -> str:
    """One fingerprint for several roles: the sha256 of their fingerprints in role order."""
    import hashlib

    return hashlib.sha256("\n".join(prints).encode()).hexdigest()
