"""What a host exposes, from its plan (#46 item 1): each mode of serve_router and a serving
group's rank, as ``status --json`` gives it (``exposes``)."""

from __future__ import annotations

from typing import Any

from host_inputs import probe, settings

from servefleet.hostplan.exposure import EVERY, exposes, keyed_prefixes
from servefleet.hostplan.plan import plan_host


def ports(plan: Any, outside: bool) -> dict[int, str]:
    return {e["port"]: e["address"] for e in exposes(plan) if e["outside"] is outside}


def test_without_a_router_the_servers_answer_every_address_on_their_open_paths_only() -> None:
    plan = plan_host(settings(serve_open_paths=["/v1/", "/health"]), probe())
    assert plan.instances
    got = exposes(plan)
    assert [e["port"] for e in got] == [i.port for i in plan.instances]
    assert all(e["address"] == EVERY and e["outside"] for e in got)
    assert all("only /v1/ /health (any other path 404" in e["to"] for e in got)
    assert all(e["to"].endswith(", /v1 with the API key when one is set") for e in got)


def test_the_key_is_named_on_the_guarded_paths_a_server_opens() -> None:
    """Which open paths the API key guards is the vLLM version's (its routes' guarded
    prefixes); none open, none named."""
    assert keyed_prefixes(("/v1/", "/health", "/metrics", "/version")) == ["/v1"]
    assert keyed_prefixes(("/",)) == ["/v1", "/v2", "/inference", "/cohere"]
    assert keyed_prefixes(("/health", "/v2/models")) == ["/v2"]
    plan = plan_host(settings(serve_open_paths=["/health"]), probe())
    assert all(e["to"].endswith("(any other path 404, the path guard)") for e in exposes(plan))


def test_behind_the_hosts_router_only_its_proxy_and_metrics_face_the_network() -> None:
    s = settings(serve_router="host")
    plan = plan_host(s, probe())
    assert ports(plan, True) == {s.serve_router_port: EVERY, s.serve_router_metrics_port: EVERY}
    inside = ports(plan, False)
    assert inside == {**{i.port: "127.0.0.1" for i in plan.instances},
                      s.serve_router_backend_port: "127.0.0.1"}  # fmt: skip


def test_serve_host_binds_the_servers_and_the_proxy_there() -> None:
    s = settings(serve_router="host", serve_host="10.0.0.7")
    plan = plan_host(s, probe())
    assert set(ports(plan, True).values()) == {"10.0.0.7"}


def test_a_groups_rank_exposes_its_rendezvous_to_its_peers_only() -> None:
    from group_inputs import fleet, rank_plan

    f = fleet(("h1", {}), ("h2", {}))
    head, worker = rank_plan(f, "h1"), rank_plan(f, "h2")
    assert ports(head, False) == {29500: EVERY, 29501: EVERY, 29550: EVERY}
    assert list(ports(head, True)) == [head.instances[0].port]  # rank 0's API
    assert ports(worker, True) == {}  # a headless rank serves no port
    assert all("group g1" in e["what"] for e in exposes(worker))


def test_status_json_carries_it() -> None:
    from servefleet.fleet.statusview import status_summary

    plan = plan_host(settings(serve_router="host"), probe())
    assert status_summary(plan, {}, "10.0.0.1")["exposes"] == exposes(plan)
