"""A host's rank in a serving group (one model across several hosts): the rank's server of the
group's spec, its placeholders bound (``$HEAD_IP``: rank 0's address; ``$IFACE_NAME``:
``serve_iface``, else the interface the probe found carrying the host's address), on one device
group of the host.

Pure (no pyinfra import).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import GROUP_GUARD_TABLE
from servefleet.hostplan.types import GroupPlace
from servefleet.kinds.roles import HOST_ALLOWED, IFACE_ALLOWED, bind_group, is_host
from servefleet.render.nftables import drop_table, load_table
from servefleet.settings.table import Settings
from servefleet.spec import Server, ServeSpec


def iface_of(probe: dict[str, Any], address: str | None) -> str | None:
    """The interface that carries ``address`` on the host, from the probe's ``addresses``
    (interface -> its addresses); None when no interface has it (or it is a host name).

    + probe: the host's probe output
    + address: the host's address on the serving network
    """
    found = probe.get("addresses")
    if not isinstance(found, dict) or not address:
        return None
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    for iface, addrs in sorted(found.items()):
        if not isinstance(addrs, list):
            continue
        for a in addrs:
            try:
                if ipaddress.ip_address(str(a).split("/")[0]) == wanted:
                    return str(iface)
            except ValueError:
                continue
    return None


def no_group(settings: Settings, spec: ServeSpec) -> DataError:
    """A multi-node selection on a host of no serving group."""
    return DataError(
        f"serve_strategy: {settings.serve_strategy!r} of {settings.serve_recipe} spans "
        f"{spec.nodes} hosts; allowed: the same serve_group on {spec.nodes} hosts (one serving "
        "group), or a strategy of one host"
    )


def place_rank(
    settings: Settings,
    spec: ServeSpec,
    group: GroupPlace,
    probe: dict[str, Any],
    address: str | None,
) -> tuple[ServeSpec, Server, str | None]:
    """The group's spec bound for this host, the server of its rank, and why the host cannot
    serve it (or None).

    + settings: the host's data
    + spec: the group's spec (every rank; placeholders unbound)
    + group: the host's rank in the group (the fleet plan's)
    + probe: the host's probe output (its interfaces' addresses)
    + address: the host's address on the serving network (its inventory address)
    """
    if spec.nodes != group.nodes:  # the fleet plan checked the group's size against it
        raise DataError(
            f"serve_group {group.name!r}: {group.nodes} hosts, but the selection spans "
            f"{spec.nodes}; allowed: {spec.nodes} hosts"
        )
    here = settings.serve_host or address
    iface = settings.serve_iface or iface_of(probe, here)
    refusal = None
    if iface is None:
        iface = "lo"  # bound only so that the spec stays whole; the host is refused
        refusal = (
            f"serve_group {group.name!r}: no interface of this host carries its address "
            f"{here!r}, which $IFACE_NAME names for NCCL and Gloo; allowed: serve_iface "
            f"({IFACE_ALLOWED})"
        )
    bound = bind_group(spec, group.head, iface)
    server = next(s for s in bound.servers if s.rank == group.rank)
    return bound, server, refusal


# Linux's default net.ipv4.ip_local_port_range: where NCCL's bootstrap and Gloo's listeners (port
# 0) land on a rank's host; a host with another range is guarded on this one only
EPHEMERAL = (32768, 60999)


def guard_commands(group: GroupPlace, ports: tuple[int, ...]) -> tuple[list[str], list[str]]:
    """The commands a rank's unit runs as root before it starts and after it stops: one nftables
    transaction that (re)makes :data:`GROUP_GUARD_TABLE`, whose rules reset a connection to the
    group's rendezvous ``ports`` from any address but the group's hosts' (and loopback), and a new
    connection to the host's ephemeral ports (:data:`EPHEMERAL`, where NCCL's and Gloo's
    listeners are) likewise, and one that removes it. torch's TCPStore, vLLM's DP coordinator
    and the collectives' listeners take any connection on every interface (#46 item 7). A host
    name is resolved by nft when the unit starts, as an IPv4 address.

    + group: the host's rank in the group (its members' addresses)
    + ports: the ports its ranks listen on for each other (``kinds.roles.rendezvous_ports``)
    """
    v4: list[str] = []
    v6: list[str] = []
    for address in group.addresses or (group.head,):
        if not is_host(address):
            raise DataError(
                f"serve_group {group.name!r}: {address!r} is not an address; allowed: {HOST_ALLOWED}"
            )
        try:
            (v6 if ipaddress.ip_address(address).version == 6 else v4).append(address)
        except ValueError:
            v4.append(address)  # a host name: nft resolves it
    low, high = EPHEMERAL
    rules = ["iif lo accept"]
    # the rendezvous ports, then the ephemeral ones NCCL's and Gloo's listeners take: a new
    # connection from outside the group is reset; replies to the host's own connections pass
    for dport, state in (("tcp dport { " + ", ".join(str(p) for p in ports) + " }", ""),
                         (f"tcp dport {low}-{high}", " ct state new")):  # fmt: skip
        rules += [f"{dport} ip saddr {{ {', '.join(v4)} }} accept"] if v4 else []
        rules += [f"{dport} ip6 saddr {{ {', '.join(v6)} }} accept"] if v6 else []
        rules += [f"{dport}{state} reject with tcp reset"]
    return load_table(GROUP_GUARD_TABLE, "input", rules), drop_table(GROUP_GUARD_TABLE)
