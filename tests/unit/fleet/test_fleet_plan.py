"""The fleet plan (``fleet/fleetplan.py``): each host's place from the inventory (its address,
groups, whether it builds or routes, the fleet's routers), read from the fleet's data only where
a place needs it; what joined hosts decide at run time (the fleet router's workers, the prefills,
the hosts that restart, the fleet pre-warm's roles); and the deploy's plan of a pyinfra run made
once, from pyinfra's inventory."""

from __future__ import annotations

from typing import Any

import pytest
from host_inputs import CREDS, probe, settings

from servefleet.fleet.fleetplan import FleetHost, fleet_of
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.types import HostPlan
from servefleet.release.prewarm_store import prewarm_roles
from servefleet.settings.table import Settings, load_defaults, settings_from


def host(name: str, *groups: str, address: str | None = None, **data: Any) -> FleetHost:
    read: list[str] = []

    def settings_of() -> Settings:
        read.append(name)
        return settings(**data)

    h = FleetHost(name, address or f"10.0.0.{name[-1]}", groups, settings_of)
    object.__setattr__(h, "read", read)  # how often the plan read its data
    return h


def test_a_place_says_who_builds_who_routes_and_which_routers_the_fleet_has() -> None:
    fleet_data = dict(serve_router="fleet", serve_router_group="routers")
    hosts = [
        host("h1", "serving", **fleet_data),
        host("r2", "routers", address="10.9.9.2", **fleet_data, serve_router_port=8100),
        host("r3", "routers", **fleet_data),
        host("b4", "serving", **fleet_data),
    ]
    fleet = fleet_of(hosts)
    s = settings(**fleet_data, serve_prewarm_host="b4")
    one = fleet.place("h1", s)
    assert (one.address, one.groups, one.builder, one.router_host) == (
        "10.0.0.1", ("serving",), False, False,
    )  # fmt: skip
    # each router host's worker API, at its own address and admin port, in inventory order
    admin = s.serve_router_admin_port
    assert one.fleet_routers == (f"http://10.9.9.2:{admin}", f"http://10.0.0.3:{admin}")
    assert fleet.place("r2", s).router_host and not fleet.place("b4", s).router_host
    assert fleet.place("b4", s).builder
    # the routers' data is read once a run, whoever asks; a serving host's never
    for name in ("h1", "b4", "r2"):
        fleet.place(name, s)
    assert [h.read for h in hosts] == [[], ["r2"], ["r3"], []]  # type: ignore[attr-defined]
    alone = fleet.place("h1", settings())  # serve_router host: no fleet routers
    assert alone.fleet_routers == () and not alone.router_host


def test_a_host_with_bad_data_stops_only_the_places_that_read_it() -> None:
    def bad() -> Settings:
        return settings_from({**load_defaults(), "serve_base_port": "eighty"}.get, CREDS)

    fleet = fleet_of([FleetHost("h1", "10.0.0.1", (), lambda: settings()),
                      FleetHost("r2", "10.0.0.2", ("routers",), bad)])  # fmt: skip
    assert fleet.place("h1", settings()).fleet_routers == ()  # no fleet router: r2 unread
    with pytest.raises(Exception, match="serve_base_port: expected a whole number"):
        fleet.place("h1", settings(serve_router="fleet", serve_router_group="routers"))


def fleet_prewarm(name: str, **over: Any) -> HostPlan:
    return plan_host(settings(serve_prewarm_scope="fleet", **over), probe())


def test_the_fleet_prewarm_roles_follow_the_inventory_whatever_order_hosts_join() -> None:
    fleet = fleet_of([host("a"), host("b"), host("c")])
    for name in "cba":  # hosts join in any order
        fleet.join(name, fleet_prewarm(name))
    want = prewarm_roles([fleet.warm[n] for n in "abc"])
    assert want == {"a": "seed", "b": "copy", "c": "copy"}  # the first cold host compiles
    assert {n: fleet.prewarm_role(n) for n in "abc"} == want
    fleet.join("d", fleet_prewarm("d"))  # roles are decided once, when the first operation asks
    assert fleet.prewarm_role("d") is None


def test_a_refused_host_joins_nothing_and_host_scope_hosts_take_no_fleet_role() -> None:
    fleet = fleet_of([host("a"), host("b"), host("c")])
    refused = plan_host(settings(serve_prewarm_scope="fleet"), probe(pci=[]))
    assert refused.refusal
    fleet.join("a", refused)  # it would have been the seed: it compiles nothing
    fleet.join("b", plan_host(settings(), probe()))  # serve_prewarm_scope host
    fleet.join("c", fleet_prewarm("c"))
    assert "a" not in fleet.plans
    assert (fleet.prewarm_role("a"), fleet.prewarm_role("b"), fleet.prewarm_role("c")) == (
        None, None, "seed",
    )  # fmt: skip


def test_the_fleet_routers_workers_and_what_restarts_come_from_the_joined_plans() -> None:
    data = dict(serve_router="fleet", serve_router_group="routers", serve_host=None)
    fleet = fleet_of([host("h1"), host("h2"), host("r3", "routers")])
    routers = (f"http://10.0.0.3:{settings().serve_router_admin_port}",)
    plans = {}
    for name in ("h2", "h1"):
        place = fleet.place(name, settings(**data))
        assert place.fleet_routers == routers  # r3's own admin port
        plans[name] = plan_host(settings(**data), probe(), place=place)
        fleet.join(name, plans[name])
    workers, roles = fleet.fleet_workers()
    every = [i.worker for n in ("h1", "h2") for i in plans[n].instances]
    assert sorted(workers) == sorted(every) and len(workers) == 8 and roles == []
    assert workers[:2] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]  # port, then host
    assert fleet.changing() == ["h1", "h2"]  # nothing runs yet: both restart
    assert fleet.prefills() == []
