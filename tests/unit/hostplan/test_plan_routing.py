"""How the host plan puts its servers behind routers (#37's campaign): the URL a router reaches
each server at (none without a router; loopback for the host's own router; the host's inventory
address for a fleet router), the worker APIs a restart takes a server out of (the host router's
admin API, the fleet's routers, none without a router), and what a fleet router's own host plans
from its probe."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from host_inputs import probe, settings
from systemd_parse import parse_unit

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


def listens(argv: Sequence[str]) -> str | None:
    """The ``--host`` a server's command line gives it (None: vLLM's default, every address)."""
    return argv[list(argv).index("--host") + 1] if "--host" in argv else None


def test_behind_the_hosts_own_router_its_servers_listen_on_loopback_only() -> None:
    """#46 item 1: vLLM guards not every route with --api-key (/invocations, /tokenize,
    /metrics, ...), so behind the host's router only its proxy's port faces the network: each
    server binds where the router reaches it, and its gate asks there."""
    plan = plan_host(settings(serve_router="host"), probe(), place=Place(address="10.0.0.5"))
    assert plan.instances
    for inst in plan.instances:
        argv, _ = parse_unit(inst.text)  # the unit's ExecStart= as systemd reads it
        assert listens(argv) == listens(inst.argv) == "127.0.0.1"
        assert inst.worker == f"http://127.0.0.1:{inst.port}"
    assert plan.desired_state()["host"] == "127.0.0.1"


def test_serve_host_is_where_the_servers_listen_behind_the_hosts_router() -> None:
    s = settings(serve_router="host", serve_host="10.1.2.3")
    plan = plan_host(s, probe(), place=Place(address="10.0.0.5"))
    assert {listens(i.argv) for i in plan.instances} == {"10.1.2.3"}
    assert [i.worker for i in plan.instances] == [
        f"http://10.1.2.3:{i.port}" for i in plan.instances
    ]
    assert plan.desired_state()["host"] == "10.1.2.3"


@pytest.mark.parametrize("router", ["none", "fleet"])
def test_without_the_hosts_router_the_servers_listen_on_every_address(router: str) -> None:
    """No router: the clients reach the servers; a fleet router on another host reaches them at
    the inventory's address (which loopback is not)."""
    s = settings(serve_router=router)
    plan = plan_host(s, probe(), place=Place(address="10.0.0.5", fleet_routers=ROUTERS))
    assert plan.instances and all(listens(i.argv) is None for i in plan.instances)
    assert all("--host" not in parse_unit(i.text)[0] for i in plan.instances)
    assert plan.desired_state()["host"] is None  # the gate asks on loopback
