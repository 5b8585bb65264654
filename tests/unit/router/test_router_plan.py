"""The router in front of a host's instances (#21): its release, argv, unit and when it counts
as converged, planned from data and one probe."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from host_inputs import probe, settings
from systemd_parse import parse_unit

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import ROUTER_UNIT
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.probe_input import probe_args, watched_paths
from servefleet.release.plan import plan_release, plan_router_release


def routed(**over: Any):
    return settings(serve_router="host", **over)


def test_no_router_by_default() -> None:
    plan = plan_host(settings(), probe())
    assert plan.router is None and "router" in plan.desired_state()
    assert plan.desired_state()["router"] is None


def test_router_lists_every_instance_of_the_host_and_the_datas_choices() -> None:
    s = routed(serve_router_policy="power_of_two", serve_router_retries=4)
    plan = plan_host(s, probe())
    r = plan.router
    assert r is not None
    assert r.workers == tuple(f"http://127.0.0.1:{8000 + i}" for i in range(len(plan.instances)))
    assert len(r.workers) == 4
    argv = list(r.argv)
    assert argv[0] == f"{r.release.path}/bin/vllm-router"
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--policy")] == list(r.workers)
    want = {
        "--host": "127.0.0.1",  # only its proxy reaches it (its worker API is unguarded)
        "--port": "18080",
        "--policy": "power_of_two",
        "--retry-max-retries": "4",
        "--cb-failure-threshold": "2",
        "--health-check-interval-secs": "5",
        "--health-failure-threshold": "3",
        "--health-success-threshold": "2",
        "--health-check-endpoint": "/health",
        "--worker-startup-timeout-secs": "300",
        "--prometheus-port": "29000",
    }
    assert {k: argv[argv.index(k) + 1] for k in want} == want
    parsed, env = parse_unit(r.text)
    assert parsed == argv and env == {
        "SPT_NOENV": "1",
        "SERVEFLEET_UNIT": r.sha,
    }  # systemd reads it as planned
    assert "\nUser=servefleet-router\n" in r.text and "\nNoNewPrivileges=yes\n" in r.text
    assert not any("VLLM_API_KEY" in line for line in r.text.splitlines())
    assert f'Environment="SERVEFLEET_UNIT={r.sha}"' in r.text


def test_serve_host_binds_the_router_and_names_the_workers() -> None:
    r = plan_host(routed(serve_host="10.1.2.3"), probe()).router
    assert r is not None and r.admin == "http://127.0.0.1:18080"  # vllm-router on loopback
    assert r.workers[0] == "http://10.1.2.3:8000"
    assert r.argv[r.argv.index("--host") + 1] == "127.0.0.1"
    assert r.argv[r.argv.index("--prometheus-host") + 1] == "10.1.2.3"
    assert r.proxy is not None and "\n        listen 10.1.2.3:8080;\n" in r.proxy.conf


def test_the_worker_list_is_in_the_routers_sha() -> None:
    four = plan_host(routed(), probe()).router
    two = plan_host(routed(serve_instances=2), probe()).router
    moved = plan_host(routed(serve_base_port=9000), probe()).router
    assert four and two and moved
    assert len({four.sha, two.sha, moved.sha}) == 3
    assert four.release.id == two.release.id  # the router's release does not depend on them


def test_router_release_is_its_own() -> None:
    s = routed()
    router = plan_router_release(s)
    stack = plan_release(s, plan_host(s, probe()).spec, None)
    assert router.id != stack.id and router.path.endswith(f"/releases/{router.id}")
    assert router.requirements == ["vllm-router==0.1.17"] and router.downloads == []
    assert router.expect == {"vllm-router": "0.1.17"} and router.imports == ["vllm_router"]
    newer = plan_router_release(routed(serve_router_version="0.1.18"))
    assert newer.id != router.id
    assert f"{s.serve_root}/plans/{router.id}.json" in watched_paths(s)
    assert '"router": {"unit": "servefleet-router.service"' in probe_args(s, stack_spec(s))


def stack_spec(s: Any):
    return plan_host(s, probe()).spec


def found(plan_text: str, sha: str, workers: list[str] | None, active: str = "active") -> dict:
    return {
        "active": active,
        "running": sha,
        "file": hashlib.sha256(plan_text.encode()).hexdigest(),
        "workers": workers,
    }


def test_converged_only_when_installed_running_and_routing_to_every_instance() -> None:
    s = routed()
    first = plan_host(s, probe())
    r = first.router
    assert r is not None and not r.converged and not first.converged
    releases = [r.release.id]
    for entry, want in [
        (found(r.text, r.sha, list(r.workers)), True),
        (found(r.text, r.sha, list(r.workers[1:])), False),  # one left out of rotation
        (found(r.text, r.sha, None), False),  # not answering
        (found(r.text, "0" * 16, list(r.workers)), False),  # runs another text
        (found(r.text, r.sha, list(r.workers), "failed"), False),
        ({**found(r.text, r.sha, list(r.workers)), "file": "x"}, False),  # file differs
    ]:
        again = plan_host(s, probe(router=entry, releases=releases)).router
        assert again is not None and again.converged is want, entry
    assert not plan_host(s, probe(router=found(r.text, r.sha, list(r.workers)))).router.converged


def test_a_router_left_when_none_is_wanted_is_stale() -> None:
    plan = plan_host(settings(), probe(router={"active": "active", "file": "ab", "workers": []}))
    assert plan.router_stale and not plan.converged
    assert not plan_host(
        settings(), probe(router={"active": "inactive", "file": None})
    ).router_stale


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"serve_router": "fleets"}, "serve_router: 'fleets' is not a router placement; allowed: none, host, fleet"),
        ({"serve_router_group": "Routers"}, "serve_router_group: 'Routers' is not an inventory group"),
        ({"serve_router": "yes"}, "serve_router: 'yes' is not a router placement"),
        ({"serve_router_policy": "kv_aware"}, "serve_router_policy: 'kv_aware' is not a router policy; allowed: round_robin"),
        ({"serve_router_port": 0}, "serve_router_port"),
        ({"serve_router_user": "servefleet"}, "serve_router_user: 'servefleet' is serve_user too"),
        ({"serve_router_user": "root"}, "serve_router_user: 'root' may not run"),
        ({"serve_router_metrics_port": 8080}, "serve_router_metrics_port: 8080 is serve_router_port too"),
        ({"serve_router_retries": 0}, "serve_router_retries"),
        ({"serve_router_version": "latest"}, "serve_router_version"),
    ],
)  # fmt: skip
def test_bad_router_data_is_one_line(over: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError) as e:
        settings(**over)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_router_port_on_an_instance_port_is_refused() -> None:
    with pytest.raises(DataError) as e:
        plan_host(routed(serve_router_port=8002), probe())
    assert "serve_router_port: 8002 is an instance's port (serve_base_port 8000 + 2)" in str(
        e.value
    )


def test_status_shows_the_router_and_its_workers_as_it_sees_them() -> None:
    from servefleet.fleet.statusview import prometheus_targets, status_problems, status_summary

    s = routed()
    r = plan_host(s, probe()).router
    assert r is not None
    healthy = {w: True for w in r.workers[:2]} | {r.workers[2]: False}  # the 4th: not listed
    entry = {**found(r.text, r.sha, list(r.workers[:3])), "healthy": healthy}
    plan = plan_host(s, probe(router=entry, releases=[r.release.id]))
    health = {str(i.port): "ok" for i in plan.instances} | {"8080": "ok"}
    st = status_summary(plan, health, "10.0.0.5")
    assert st["router"] == {
        "unit": ROUTER_UNIT,
        "port": 8080,
        "metrics_port": 29000,
        "active": "active",
        "drift": False,
        "health": "ok",
        "workers": {
            "http://127.0.0.1:8000": "healthy",
            "http://127.0.0.1:8001": "healthy",
            "http://127.0.0.1:8002": "unhealthy",
            "http://127.0.0.1:8003": "out of rotation",
        },
    }
    problems = [p for p in status_problems("h", st) if ROUTER_UNIT in p]
    assert problems == [
        f"h: {ROUTER_UNIT} finds http://127.0.0.1:8002 unhealthy",
        f"h: {ROUTER_UNIT} finds http://127.0.0.1:8003 out of rotation",
    ]
    groups = prometheus_targets({"h": st})
    assert {
        "targets": ["10.0.0.5:29000"],
        "labels": {"host": "h", "job": "servefleet-router"},
    } in groups
    assert status_summary(plan_host(settings(), probe()), {}, "x")["router"] is None


def test_a_locked_router_release_is_the_locks(tmp_path: Any) -> None:
    from dataclasses import replace

    from servefleet.release.lock import write_lock

    s = routed()
    unlocked = plan_router_release(s)
    assert unlocked.stack is not None and unlocked.stack.name == "router" and not unlocked.locked
    pylock = 'lock-version = "1.0"\n[[packages]]\nname = "vllm-router"\nversion = "0.1.17"\n' \
             'wheels = [{ url = "https://x.example/r.whl", hashes = { sha256 = "' + "b" * 64 + '" } }]\n'  # fmt: skip
    write_lock(tmp_path, {unlocked.stack: pylock}, {}, {})
    locked = plan_router_release(replace(s, sdk_lock=str(tmp_path)))
    assert locked.pylock == pylock and locked.id != unlocked.id
    other = tmp_path / "other"
    write_lock(other, {}, {}, {})
    with pytest.raises(DataError) as e:
        plan_router_release(replace(s, sdk_lock=str(other)))
    assert "does not lock this host's stack router" in str(e.value)
