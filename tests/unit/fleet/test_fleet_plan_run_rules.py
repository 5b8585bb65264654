"""What the fleet plan decides from the joined plans at run time (``fleet/fleetplan.py``):
who restarts behind the fleet's routers, the fleet router's workers and prefills, the fleet's
routers for a host that uses none, and a serving group a run does not wholly reach. Issue #52:
survivors of ``bench/ast_mutation.py`` on ``fleetplan.py``, each killed here: ``changing``
without ``not p.converged`` (every host taken out of rotation) or ``not p.router_host``;
``fleet_workers`` without ``not p.router_host``; ``prefills`` without ``i.worker``;
``routers`` without its ``router_fleet`` check (``drop``); ``group_outside``'s statements
dropped (a run over part of a group allowed, or its line without the ranks); ``place``'s
``router_host`` without ``settings.router_fleet and`` (a host in the router group served
nothing); the prefills by name (``sorted``). The plans are
stand-ins with only what these read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from group_inputs import fleet as group_fleet
from host_inputs import settings

from servefleet.fleet.fleetplan import FleetHost, fleet_of


def _plan(fleet: bool = True, router_host: bool = False, converged: bool = False,
          *instances: tuple[str | None, str]) -> Any:  # fmt: skip
    return SimpleNamespace(
        settings=SimpleNamespace(router_fleet=fleet),
        router_host=router_host,
        converged=converged,
        instances=[SimpleNamespace(worker=w, role=r) for w, r in instances],
    )


def _run(**plans: Any) -> Any:
    f = fleet_of([FleetHost(n, f"10.0.0.{i}", (), settings) for i, n in enumerate(plans)])
    f.plans.update(plans)
    return f


def test_only_the_serving_hosts_that_restart_leave_the_fleet_routers() -> None:
    f = _run(
        a=_plan(True, False, False, ("http://a:8000", "main")),
        b=_plan(True, False, True, ("http://b:8000", "main")),  # converged: stays
        r=_plan(True, True, False),  # a router host: routes only
        n=_plan(False, False, False, ("http://n:8000", "main")),  # behind no fleet router
    )
    assert f.changing() == ["a"]


def test_the_fleet_routers_workers_are_the_serving_hosts_own() -> None:
    f = _run(
        a=_plan(True, False, False, ("http://a:8000", "main"), (None, "main")),
        r=_plan(True, True, False, ("http://r:8000", "main")),  # a router host's: never a worker
        n=_plan(False, False, False, ("http://n:8000", "main")),
    )
    workers, roles = f.fleet_workers()
    assert workers == ["http://a:8000"] and roles == []


def test_the_prefills_are_the_workers_of_prefill_instances() -> None:
    f = _run(
        a=_plan(
            True,
            False,
            False,
            ("http://a:8000", "prefill"),
            (None, "prefill"),
            ("http://a:8001", "decode"),
        ),  # fmt: skip
        r=_plan(True, True, False, ("http://r:8000", "prefill")),
    )
    assert f.prefills() == ["http://a:8000"]
    workers, roles = f.fleet_workers()
    assert sorted(zip(workers, roles, strict=True)) == [
        ("http://a:8000", "prefill"),
        ("http://a:8001", "decode"),
    ]


def test_a_host_behind_no_fleet_router_has_no_fleet_routers() -> None:
    hosts = [FleetHost("h1", "10.0.0.1", ("serving",), settings),
             FleetHost("r2", "10.0.0.2", ("routers",), settings)]  # fmt: skip
    f = fleet_of(hosts)
    s = settings(serve_router_group="routers")  # the group is there, but serve_router isn't fleet
    assert not s.router_fleet
    assert f.routers(s) == ()
    assert f.place("h1", s).fleet_routers == ()
    assert not f.place("r2", s).router_host  # in the group, but no fleet router: it serves


def test_the_prefills_are_in_inventory_order() -> None:
    """``sorted(self._joined())`` (``sorted``) survived: the prefills by host name."""
    f = _run(
        b=_plan(True, False, False, ("http://b:8000", "prefill")),
        a=_plan(True, False, False, ("http://a:8000", "prefill")),
    )
    assert f.prefills() == ["http://b:8000", "http://a:8000"]


def test_a_run_over_part_of_a_serving_group_is_named_with_the_ranks_it_misses() -> None:
    whole = group_fleet(("h1", {}), ("h2", {}))
    assert whole.group_outside("g1") is None
    part = group_fleet(("h1", {}), ("h2", {}), limit=("h1",))
    assert part.group_outside("g1") == (
        "serve_group 'g1': this run does not reach h2 (rank 1), and a group restarts as one; "
        "allowed: a run over every host of the group (h1, h2)"
    )
