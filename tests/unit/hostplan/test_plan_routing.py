"""How the host plan puts its servers behind routers (#37's campaign): the URL a router reaches
each server at (none without a router; loopback for the host's own router; the host's inventory
address for a fleet router), the worker APIs a restart takes a server out of (the host router's
admin API, the fleet's routers, none without a router), and what a fleet router's own host plans
from its probe."""

from __future__ import annotations

from typing import Any

import pytest
from host_inputs import probe, settings

from servefleet.hostplan import plan as plan_module
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.types import Place

ROUTERS = ("http://10.0.0.9:8401", "http://10.0.0.10:8401")


def test_no_router_no_worker_url_and_no_router_to_leave() -> None:
    plan = plan_host(settings(), probe(), place=Place(address="10.0.0.5", fleet_routers=ROUTERS))
    assert plan.instances and all(i.worker is None for i in plan.instances)
    assert plan.routers == () and plan.router is None


def test_the_hosts_own_router_reaches_its_servers_on_loopback() -> None:
    s = settings(serve_router="host")
    plan = plan_host(s, probe(), place=Place(address="10.0.0.5"))
    assert [i.worker for i in plan.instances] == [
        f"http://127.0.0.1:{i.port}" for i in plan.instances
    ]
    assert plan.router is not None and plan.routers == (plan.router.admin,)
    assert list(plan.router.workers) == [i.worker for i in plan.instances]


def test_a_fleet_router_reaches_each_server_at_the_hosts_address() -> None:
    s = settings(serve_router="fleet")
    plan = plan_host(s, probe(), place=Place(address="10.0.0.5", fleet_routers=ROUTERS))
    assert [i.worker for i in plan.instances] == [
        f"http://10.0.0.5:{i.port}" for i in plan.instances
    ]
    assert plan.routers == ROUTERS and plan.router is None
    # no fleet router planned yet (none in the run): the servers are not routed
    alone = plan_host(s, probe(), place=Place(address="10.0.0.5"))
    assert all(i.worker is None for i in alone.instances) and alone.routers == ()


def test_a_fleet_routers_host_plans_its_router_from_its_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[Any, ...]] = []
    real = plan_module.plan_router

    def recorded(*args: Any) -> Any:
        seen.append(args)
        return real(*args)

    monkeypatch.setattr(plan_module, "plan_router", recorded)
    s = settings(serve_router="fleet")
    found = {"active": "active", "file": "ab", "workers": []}
    plan = plan_host(s, probe(router=found, releases=["r1"]), place=Place(router_host=True))
    assert plan.router is not None and plan.router_release is not None
    assert plan.router_host and plan.instances == () and plan.routers == ()
    ((settings_, release, workers, router, releases),) = seen
    assert (settings_, release, workers) == (s, plan.router_release, ())
    assert (router, releases) == (found, ["r1"])
    seen.clear()
    bare = {k: v for k, v in probe().items() if k != "releases"}
    plan_host(s, bare, place=Place(router_host=True))
    assert seen[0][3:] == (None, [])
