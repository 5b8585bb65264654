"""Serving groups: one model served across several hosts (a vLLM multi-node strategy), an object
of the fleet plan.

A serving group is the set of inventory hosts whose data gives the same ``serve_group``. Its
ranks follow inventory order, or ``serve_group_rank`` where a host gives one (the others take
the ranks left, in inventory order). Its spec is resolved once, from rank 0's data; every member
must select the same (recipe, strategy, hardware, variant, features, node count and the stack),
and the group must have exactly as many hosts as the selection has nodes. Each check fails in
one line naming the group, before any host is planned, so nothing changes anywhere.

The group's hash covers what every rank runs with (the spec's ranks, the members and their
addresses): every rank's unit carries it, so a change of any rank changes all of them, and the
probe says which group hash each host runs.

Pure (no pyinfra import).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servefleet.base.errors import DataError
from servefleet.hostplan.extras import resolve_for
from servefleet.hostplan.types import GroupPlace
from servefleet.settings.table import Settings
from servefleet.spec import ServeSpec

# the data keys every member of a group must give alike: what the group serves and runs
SAME = (
    "serve_recipe",
    "serve_strategy",
    "serve_hardware",
    "serve_variant",
    "serve_features",
    "serve_nodes",
    "serve_extra_args",
    "serve_extra_env",
    "serve_base_port",
    "sdk_pins",
    "serve_iface",
)


@dataclass(frozen=True)
class Member:
    """One host of a group.

    + host: its inventory name
    + rank: its rank (0 serves the group's API)
    + address: where the other ranks reach it (its ``serve_host``, else the inventory's)
    """

    host: str
    rank: int
    address: str


@dataclass(frozen=True)
class ServingGroup:
    """A group of hosts serving one model together.

    + name: its ``serve_group``
    + members: by rank
    + spec: the group's spec (one server per rank, placeholders unbound)
    """

    name: str
    members: tuple[Member, ...]
    spec: ServeSpec

    @property
    def head(self) -> str:
        """Rank 0's address: the rendezvous and the DP coordinator."""
        return self.members[0].address

    @property
    def sha(self) -> str:
        """The group's hash: what its ranks run with, and who they are."""
        doc = {
            "group": self.name,
            "spec": self.spec.to_json(),
            "members": [[m.host, m.rank, m.address] for m in self.members],
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(m.host for m in self.members)

    def member(self, host: str) -> Member:
        return next(m for m in self.members if m.host == host)

    def place(self, host: str) -> GroupPlace:
        """Host ``host``'s rank in the group, as its plan takes it."""
        m = self.member(host)
        return GroupPlace(
            name=self.name,
            rank=m.rank,
            nodes=len(self.members),
            head=self.head,
            sha=self.sha,
            hosts=self.hosts,
            addresses=tuple(m.address for m in self.members),
        )


def _differs(a: Settings, b: Settings) -> str | None:
    return next((k for k in SAME if getattr(a, k) != getattr(b, k)), None)


def ranks(name: str, hosts: Sequence[tuple[str, int | None]]) -> list[str]:
    """The group's hosts by rank: each given ``serve_group_rank`` where it is given, the others
    the ranks left in inventory order.

    + name: the group
    + hosts: (host, its serve_group_rank or None), in inventory order
    """
    size = len(hosts)
    by_rank: dict[int, str] = {}
    for host, rank in hosts:
        if rank is None:
            continue
        if rank >= size:
            raise DataError(
                f"serve_group_rank: {rank} on {host}, but the group {name!r} has {size} hosts; "
                f"allowed: 0-{size - 1}"
            )
        if rank in by_rank:
            raise DataError(
                f"serve_group_rank: {rank} on both {by_rank[rank]} and {host} (group {name!r}); "
                "allowed: each rank on one host"
            )
        by_rank[rank] = host
    rest = iter(h for h, r in hosts if r is None)
    return [by_rank[r] if r in by_rank else next(rest) for r in range(size)]


def group_of(
    name: str,
    hosts: Sequence[tuple[str, str, Callable[[], Settings]]],
) -> ServingGroup:
    """The serving group ``name`` of the inventory hosts that give it, checked (one line, a
    DataError, on the first problem).

    + name: the group's ``serve_group``
    + hosts: (inventory name, address, its validated data), in inventory order
    """
    data = {h: read() for h, _, read in hosts}
    address = {h: a for h, a, _ in hosts}
    order = ranks(name, [(h, data[h].serve_group_rank) for h, _, _ in hosts])
    head = data[order[0]]
    for h in order[1:]:
        key = _differs(head, data[h])
        if key:
            raise DataError(
                f"serve_group {name!r}: {key} on {h} is {getattr(data[h], key)!r}, on {order[0]} "
                f"{getattr(head, key)!r}; allowed: the same on every host of the group"
            )
    if head.router_per_host:  # one API per group: a router on each rank would front nothing
        raise DataError(
            f"serve_group {name!r}: serve_router is 'host', but a group serves one API, rank 0's; "
            "allowed: 'none', or 'fleet' (the fleet's routers take rank 0 as one worker)"
        )
    spec = resolve_for(head)
    if spec.nodes < 2:
        raise DataError(
            f"serve_group {name!r}: its hosts serve {head.serve_recipe} with serve_strategy "
            f"{head.serve_strategy!r}, which runs on one host; allowed: a multi-node strategy "
            "(multi_node_*), or no serve_group"
        )
    if len(order) != spec.nodes:
        raise DataError(
            f"serve_group {name!r}: {len(order)} hosts ({', '.join(order)}), but "
            f"{head.serve_strategy} of {head.serve_recipe} spans {spec.nodes} nodes; allowed: "
            f"exactly {spec.nodes} hosts in the group (or serve_nodes for more)"
        )
    members = tuple(Member(h, r, data[h].serve_host or address[h]) for r, h in enumerate(order))
    return ServingGroup(name, members, spec)
