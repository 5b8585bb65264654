"""Prefill/decode placement on a host: which of its device groups serve prefill and which
decode (``serve_pd_pairs`` behind the host's router, or by inventory group with ``serve_roles``
behind a fleet router), each bound to the host, each with its own NIXL side-channel port.

Pure (no pyinfra import).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from servefleet.base.errors import DataError
from servefleet.kinds.roles import DECODE, PREFILL, bind, one_host_values
from servefleet.settings.table import Settings
from servefleet.spec import Server, ServeSpec


def place_pd(
    settings: Settings,
    spec: ServeSpec,
    groups: list[str],
    host_groups: Sequence[str] = (),
    address: str | None = None,
) -> tuple[ServeSpec, list[tuple[Server | None, str]], str | None]:
    """A prefill/decode selection on this host. Without ``serve_roles``: ``serve_pd_pairs``
    prefill servers on the first device groups, as many decode servers on the next, behind the
    host's router. With it: every device group serves the role whose group the host is in,
    behind a fleet router. The placeholders are bound to this host (each pool's node is the
    server itself: :func:`servefleet.kinds.roles.one_host_values`); the k-th server of a role on
    a host (from 0) listens for NIXL on the recipe's side-channel port + 10 k. Returns the
    bound spec, each instance's (server, role), and a refusal when the host cannot serve it."""
    if settings.api_key:  # measured with vllm-router 0.1.17; its source: vllm_pd_router.rs
        raise DataError(
            "creds_api_key_env: an API key, but the selection has the roles prefill and decode, "
            "and vllm-router's prefill/decode mode sends its workers its own OPENAI_API_KEY, "
            "never the client's, and checks no key itself: behind it the servers' key would "
            "guard nothing; allowed: no API key (keep serve_router_port on a trusted network)"
        )
    if settings.serve_roles:
        return _place_by_group(settings, spec, groups, host_groups, address)
    if not settings.router_per_host:
        raise DataError(
            f"serve_router: {settings.serve_router!r}, but the selection has the roles prefill "
            "and decode, which are served behind the host's router (or set serve_roles); "
            "allowed: host"
        )
    here = settings.instance_host or "127.0.0.1"  # behind the host's router: where they listen
    spec = bind(spec, one_host_values(here, here, settings.serve_router_port))
    by_role = {x.role: x for x in spec.servers}
    prefill, decode = by_role[PREFILL], by_role[DECODE]
    if prefill.npus != decode.npus:
        raise DataError(
            f"serve_recipe: its prefill and decode servers need {prefill.npus} and "
            f"{decode.npus} devices; allowed: a selection whose roles need as many"
        )
    pairs = settings.serve_pd_pairs
    refusal = None
    if len(groups) < 2 * pairs:
        refusal = (
            f"the host has {len(groups)} device groups of {prefill.npus}; serve_pd_pairs {pairs} "
            f"needs {2 * pairs} (a prefill and a decode server each)"
        )
    placed: list[tuple[Server | None, str]] = []
    for role, server in ((PREFILL, prefill), (DECODE, decode)):
        for k in range(pairs):
            placed.append((_side_channel(server, k), role))
    return spec, placed, refusal


def _place_by_group(
    settings: Settings,
    spec: ServeSpec,
    groups: list[str],
    host_groups: Sequence[str],
    address: str | None,
) -> tuple[ServeSpec, list[tuple[Server | None, str]], str | None]:
    """``serve_roles``: this host serves the role whose inventory group it is in."""
    roles = settings.serve_roles
    if not settings.router_fleet or set(roles) != {PREFILL, DECODE}:
        raise DataError(
            f"serve_roles: {dict(roles)!r} places each role on the hosts of a group, behind a "
            "fleet router; allowed: both prefill and decode named, with serve_router = 'fleet'"
        )
    mine = [r for r in (PREFILL, DECODE) if roles[r] in host_groups]
    if len(mine) != 1:
        where = "both" if mine else "neither"
        return (
            spec,
            [],
            (
                f"serve_roles: this host is in {where} of the groups {roles[PREFILL]!r} (prefill) and "
                f"{roles[DECODE]!r} (decode); allowed: a host of one of them"
            ),
        )
    here = settings.serve_host or address or "127.0.0.1"
    spec = bind(spec, one_host_values(here, here, settings.serve_router_port))
    server = next(x for x in spec.servers if x.role == mine[0])
    return spec, [(_side_channel(server, k), mine[0]) for k in range(len(groups))], None


SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
SIDE_CHANNEL_DEFAULT = 5600  # vLLM's, when the recipe sets none


def _side_channel(server: Server, k: int) -> Server:
    """The k-th server of a role on a host: its own NIXL side-channel port (unique per host)."""
    if k == 0:
        return server
    base = server.env.get(SIDE_CHANNEL_PORT, str(SIDE_CHANNEL_DEFAULT))
    port = int(base) + 10 * k if base.isdigit() else SIDE_CHANNEL_DEFAULT + 10 * k
    return dataclasses.replace(server, env={**server.env, SIDE_CHANNEL_PORT: str(port)})
