"""Three more state changes killed half-way (#46; the fourth, the seed's compile-only build, is
in ``test_fleet_prewarm.py``): the controller SIGKILLed between the API key's write and the
servers' restart onto it, between the host programs' upload (one tar) and their unpack, and
between the router proxy's new configuration and unit and its restart (and at their write).
Each time the host keeps serving meanwhile, the next run converges, and the one after changes
nothing."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from faults import run, run_killed, totals
from labhelpers import on_host, wait_for
from test_endpoints import ENV_VAR, keyed, status_code
from test_router import MODEL, address

from servefleet.fleet.lab.chat import chat_once

LIMIT = ("--limit", "lab1")
LIB = "/opt/servefleet/lib"
TAR = f"{LIB}/.programs.tar"


def ok(proc: Any) -> None:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_a_key_rotation_killed_before_the_restart_converges(
    lab: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = ("sk-lab-" + secrets.token_hex(24) for _ in range(2))
    where = address(lab, "lab1")
    try:
        ok(run(lab, *LIMIT, env=keyed(lab, old)))
        monkeypatch.setenv(ENV_VAR, new)
        started, killed = run_killed(
            lab, *LIMIT, at=lambda n, name: "Converge the instances" in name
        )
        assert killed and any("Write the servers' API key" in s for s in started), started
        # the key file holds the new key; the servers still run with the old one, and serve
        assert all(status_code(where, p, "/v1/chat/completions", old) == 200 for p in (8000, 8003))
        ok(run(lab, *LIMIT, env=keyed(lab, new)))
        for port in range(8000, 8004):
            assert status_code(where, port, "/v1/chat/completions", new) == 200
            assert status_code(where, port, "/v1/chat/completions", old) == 401
        assert totals(run(lab, "--json", *LIMIT, env=keyed(lab, new)))["success"] == 0
    finally:
        monkeypatch.delenv(ENV_VAR, raising=False)
        ok(run(lab, *LIMIT, env=keyed(lab, None)))


def test_the_host_programs_killed_between_upload_and_unpack_converge(lab: dict[str, Any]) -> None:
    ok(run(lab, *LIMIT))
    on_host(lab, "lab1", f"rm {LIB}/group.py {LIB}/rotation.py")  # two programs out of date
    started, killed = run_killed(
        lab, *LIMIT, at=lambda n, name: "Put the host programs in place" in name
    )
    assert killed and any("Upload the host programs (2:" in s for s in started), started
    on_host(lab, "lab1", f"test -s {TAR}")  # uploaded, not unpacked
    assert status_code(address(lab, "lab1"), 8000, "/v1/chat/completions") == 200
    ok(run(lab, *LIMIT))
    listed = on_host(lab, "lab1", f"ls -A {LIB}").stdout.split()
    assert {"group.py", "rotation.py"} <= set(listed) and not [n for n in listed if n[0] == "."]
    assert totals(run(lab, "--json", *LIMIT))["success"] == 0


def _routes(lab: dict[str, Any], port: int) -> bool:
    """A chat through lab1's router proxy at ``port`` answers."""
    try:
        return bool(chat_once(address(lab, "lab1"), port, MODEL, "hi", max_tokens=1))
    except OSError:
        return False


@pytest.mark.parametrize("point", ["(Re)start servefleet-router-proxy", "Write the router proxy's"])
def test_the_router_proxy_killed_between_its_write_and_its_restart_converges(
    lab: dict[str, Any], point: str
) -> None:
    router = ("--data", "serve_router=host")
    try:
        ok(run(lab, *LIMIT, *router))
        assert _routes(lab, 8080)
        moved = (*router, "--data", "serve_router_port=8090")
        started, killed = run_killed(lab, *LIMIT, *moved, at=lambda n, name: point in name)
        assert killed, started
        assert _routes(lab, 8080), "the proxy stopped serving its clients"
        ok(run(lab, *LIMIT, *moved))
        wait_for(lambda: _routes(lab, 8090), "the proxy serves at its new port")
        assert not _routes(lab, 8080)
        assert totals(run(lab, "--json", *LIMIT, *moved))["success"] == 0
    finally:
        ok(run(lab, *LIMIT, "--data", "serve_router=none"))
