"""The fleet plan: one run's hosts, what spans them, and each host's place among them.

Everything a host's plan needs to know about other hosts is decided here, once per run, from
the inventory (each host's name, address, groups and data): who routes (the hosts of
``serve_router_group``) and the worker APIs every serving host drains through, who compiles
for the fleet (``serve_prewarm_host``), which inventory groups serve which prefill/decode role.
A host's plan (:func:`servefleet.hostplan.plan.plan_host`) takes its :class:`Place` from here
and never reads another host's data itself.

While the hosts are planned each joins its plan (:meth:`FleetPlan.join`). What the run decides
only when its operations run, once every host is planned, is read from the joined plans: the
fleet router's workers, the prefills a decode re-checks against, each host's part in a fleet
pre-warm.

Pure (no pyinfra import): the deploy builds it from pyinfra's inventory
(:mod:`servefleet.entry.steps.fleet`), a fleet command from the inventory it read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from servefleet.fleet.groups import ServingGroup, group_of
from servefleet.hostplan.types import HostPlan, Place
from servefleet.release.prewarm_store import Store, WarmEntry, prewarm_roles
from servefleet.router.plan import admin_url, fleet_order
from servefleet.settings.table import Settings


@dataclass(frozen=True)
class FleetHost:
    """One inventory host as the fleet plan reads it.

    + name: its inventory name
    + address: how the inventory reaches it (its ``ssh_hostname``, else its name)
    + groups: its inventory groups
    + settings: its validated data, read when the plan needs it (a host's bad data stops only
      the runs that need it)
    + serving_group: the ``serve_group`` its data gives (as given: its own check comes with its
      data), or None
    + in_run: the run reaches it (pyinfra's ``--limit`` and ``--exclude``)
    """

    name: str
    address: str
    groups: tuple[str, ...]
    settings: Callable[[], Settings] = field(compare=False, repr=False)
    serving_group: str | None = None
    in_run: bool = True


@dataclass
class FleetPlan:
    """One run's hosts in inventory order, and what they join while they are planned.

    + hosts: every inventory host, in inventory order
    """

    hosts: tuple[FleetHost, ...]
    plans: dict[str, HostPlan] = field(default_factory=dict)  # joined, by host name
    warm: dict[str, WarmEntry] = field(default_factory=dict)  # as fleet pre-warm saw them
    _routers: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)
    _prewarm: dict[str, str] | None = field(default=None, repr=False)
    _groups: dict[str, ServingGroup] = field(default_factory=dict, repr=False)
    restarts: dict[str, bool] = field(default_factory=dict)  # group -> it restarts (run time)
    gates: dict[str, str | None] = field(default_factory=dict)  # group -> why its gate failed
    restored: dict[str, bool] = field(default_factory=dict)  # group -> its roll-back passed

    def host(self, name: str) -> FleetHost:
        return next(h for h in self.hosts if h.name == name)

    def in_group(self, group: str) -> list[FleetHost]:
        """The hosts of an inventory group, in inventory order."""
        return [h for h in self.hosts if group in h.groups]

    def routers(self, settings: Settings) -> tuple[str, ...]:
        """With ``serve_router = "fleet"``: the worker API of each router host (the hosts of
        ``serve_router_group``, each at its own ports), in inventory order; else none."""
        if not settings.router_fleet:
            return ()
        group = settings.serve_router_group
        if group not in self._routers:
            self._routers[group] = tuple(
                admin_url(h.settings(), h.address) for h in self.in_group(group)
            )
        return self._routers[group]

    def group(self, name: str) -> ServingGroup:
        """The serving group ``name`` (:func:`servefleet.fleet.groups.group_of`), checked once a
        run; DataError (one line) when it is not one."""
        if name not in self._groups:
            members = [(h.name, h.address, h.settings) for h in self.hosts
                       if h.serving_group == name]  # fmt: skip
            self._groups[name] = group_of(name, members)
        return self._groups[name]

    def place(self, name: str, settings: Settings) -> Place:
        """Where host ``name`` (with its validated ``settings``) stands in the fleet."""
        h = self.host(name)
        group = settings.serve_group
        return Place(
            address=h.address,
            groups=h.groups,
            builder=name == settings.serve_prewarm_host,
            router_host=settings.router_fleet and settings.serve_router_group in h.groups,
            fleet_routers=self.routers(settings),
            group=self.group(group).place(name) if group else None,
        )

    def group_outside(self, name: str) -> str | None:
        """Why a deploy over this run must not change serving group ``name`` (one of its hosts
        is outside the run: a group restarts as one), or None."""
        group = self.group(name)
        out = [m for m in group.members if not self.host(m.host).in_run]
        if not out:
            return None
        ranks = ", ".join(f"{m.host} (rank {m.rank})" for m in out)
        return (
            f"serve_group {name!r}: this run does not reach {ranks}, and a group restarts as "
            f"one; allowed: a run over every host of the group ({', '.join(group.hosts)})"
        )

    # -- what the hosts join while they are planned, read when operations run

    def join(self, name: str, plan: HostPlan) -> None:
        """Host ``name``'s plan, made (and how fleet pre-warm sees it, the store as it is now).
        A refused host joins nothing: nothing of it runs."""
        if plan.refusal is not None:
            return
        self.plans[name] = plan
        self.warm[name] = warm_entry(name, plan)

    def _joined(self) -> list[tuple[str, HostPlan]]:
        return [(h.name, self.plans[h.name]) for h in self.hosts if h.name in self.plans]

    def changing(self) -> list[str]:
        """The hosts behind the fleet's routers whose servers this run restarts."""
        return [
            n
            for n, p in self._joined()
            if p.settings.router_fleet and not p.router_host and not p.converged
        ]

    def fleet_workers(self) -> tuple[list[str], list[str]]:
        """Every worker of the fleet's serving hosts, in the fleet router's order
        (:func:`servefleet.router.plan.fleet_order`), and their roles (none when every one
        serves whole requests)."""
        role_of = {
            i.worker: i.role
            for _, p in self._joined()
            if p.settings.router_fleet and not p.router_host
            for i in p.instances
            if i.worker
        }
        workers = fleet_order(list(role_of))
        pd = any(r != "main" for r in role_of.values())
        return workers, [role_of[w] for w in workers] if pd else []

    def prefills(self) -> list[str]:
        """The workers of every prefill of the run, in inventory order."""
        return [
            i.worker
            for _, p in self._joined()
            if p.settings.router_fleet and not p.router_host
            for i in p.instances
            if i.worker and i.role == "prefill"
        ]

    def group_missing(self, name: str, failed: Sequence[str] = ()) -> list[str]:
        """The hosts of serving group ``name`` that have no plan in this run (refused, failed
        while planned) or have failed since (``failed``: pyinfra's failed hosts, by name)."""
        return [h for h in self.group(name).hosts if h not in self.plans or h in failed]

    def group_changing(self, name: str) -> bool:
        """Some rank of serving group ``name`` does not run what its plan wants (every rank
        then restarts: the group restarts as one)."""
        return any(not self.plans[h].converged for h in self.group(name).hosts if h in self.plans)

    def prewarm_role(self, name: str) -> str | None:
        """Host ``name``'s part in the fleet pre-warm (decided once, when first asked, over the
        hosts that joined one: :func:`servefleet.release.prewarm_store.prewarm_roles`)."""
        if self._prewarm is None:
            entries = [self.warm[n] for n, _ in self._joined()]
            self._prewarm = prewarm_roles([e for e in entries if e.fleet])
        return self._prewarm.get(name)


def warm_entry(name: str, plan: HostPlan) -> WarmEntry:
    """Host ``name`` as fleet pre-warm sees it (from its plan and the controller's store)."""
    s, fingerprint = plan.settings, plan.spec.compile_fingerprint
    fleet = s.serve_prewarm_scope == "fleet" and bool(fingerprint)
    return WarmEntry(
        host=name,
        fingerprint=fingerprint,
        fleet=fleet,
        warm=plan.warm,
        kept=fleet and Store(s.serve_prewarm_store).has(fingerprint or ""),
        builder=plan.builder,
    )


def fleet_of(hosts: Sequence[FleetHost]) -> FleetPlan:
    """The fleet plan of a run over ``hosts`` (every inventory host, in inventory order).

    + hosts: the inventory's hosts
    """
    return FleetPlan(tuple(hosts))
