"""The host's converge and its router (#21): each instance leaves the router's rotation before it
restarts and comes back after its gate, in instance order; a run that died with one out puts it
back; what the router lists is read from its worker API. The router here is an HTTP server that
records the worker API calls as vllm-router answers them (``/workers``, ``POST
/add_worker?url=``, ``POST /remove_worker?url=``); systemd and the gate are the test's."""

from __future__ import annotations

import json
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import instances  # noqa: E402
import restart_gate  # noqa: E402
import rotation  # noqa: E402
import systemd_units  # noqa: E402
import warm_state  # noqa: E402

WORKERS = [f"http://127.0.0.1:{8000 + i}" for i in range(3)]


class Router(ThreadingHTTPServer):
    def __init__(self, workers: list[str], events: list[str]) -> None:
        self.workers, self.events = list(workers), events
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(BaseHTTPRequestHandler):
    server: Router

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/workers":  # its health checks find every worker it lists healthy
            listed = [{"url": w, "is_healthy": True} for w in self.server.workers]
            self._answer(200, json.dumps({"workers": listed}).encode())
        else:
            self._answer(404, b"")

    def do_POST(self) -> None:
        path, _, query = self.path.partition("?")
        url = urllib.parse.parse_qs(query).get("url", [""])[0]
        if path == "/remove_worker":
            self.server.workers.remove(url)
        elif path == "/add_worker":
            self.server.workers.append(url)
        else:
            return self._answer(404, b"")
        self.server.events.append(f"{path[1:]} {url}")
        self._answer(200, b"ok")


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A converge's world: instances 0-2 run an old sha, the router runs its unit and lists
    them; systemctl calls and gates are recorded in one event list with the router's."""
    events: list[str] = []
    router = Router(WORKERS, events)
    threading.Thread(target=router.serve_forever, daemon=True).start()
    text = '[Service]\nEnvironment="SERVEFLEET_UNIT=a1"\n'
    monkeypatch.setattr(systemd_units, "UNIT_DIR", tmp_path)
    (tmp_path / rotation.ROUTER).write_text(text)
    running = {f"servefleet-vllm-{i}.service": "old" for i in range(3)}

    def systemctl(*args: str, check: bool = True) -> str:
        if args[0] == "restart":  # the router's own (the instances restart in the gate)
            events.append(f"restart {args[1]}")
        return ""

    def show(units: list[str], *props: str) -> list[dict[str, str]]:
        return [{"ActiveState": "active", "MainPID": "1"} for _ in units]

    def live(devices_env: str) -> dict[str, dict[str, Any]]:
        return {u: {"active": "active", "sha": sha, "port": None, "devices": set()}
                for u, sha in running.items()}  # fmt: skip

    def gate(state: dict[str, Any], inst: dict[str, Any], restart: bool) -> None:
        events.append(f"gate {inst['unit']}")
        running[inst["unit"]] = inst["sha"]

    monkeypatch.setattr(systemd_units, "systemctl", systemctl)
    monkeypatch.setattr(systemd_units, "show", show)
    monkeypatch.setattr(systemd_units, "live", live)
    monkeypatch.setattr(systemd_units, "write_units", lambda state: None)
    monkeypatch.setattr(warm_state, "is_cold", lambda state, inst: False)
    monkeypatch.setattr(restart_gate, "start_through_gate", gate)
    monkeypatch.setattr(systemd_units, "process_env", lambda pid: {systemd_units.SHA_VAR: "a1"})
    state = {
        "devices_env": "RBLN_VISIBLE_DEVICES",
        "health_timeout": 5,
        "model": "m",
        "instances": [
            {"unit": f"servefleet-vllm-{i}.service", "sha": "new", "worker": WORKERS[i]}
            for i in range(3)
        ],  # fmt: skip
        "routers": [f"http://127.0.0.1:{router.server_port}"],
        "router": {
            "unit": rotation.ROUTER,
            "sha": "a1",
            "text": text,
            "port": 8080,
            "admin": f"http://127.0.0.1:{router.server_port}",
            "workers": WORKERS,
            "release": "rel",
        },  # fmt: skip
    }
    try:
        yield {"state": state, "events": events, "router": router, "running": running}
    finally:
        router.shutdown()
        router.server_close()


def test_each_instance_leaves_the_rotation_before_it_restarts(host: dict[str, Any]) -> None:
    instances.bring_to(host["state"])
    want = []
    for i, worker in enumerate(WORKERS):
        unit = f"servefleet-vllm-{i}.service"
        want += [f"remove_worker {worker}", f"gate {unit}", f"add_worker {worker}"]
    assert host["events"] == want
    assert sorted(host["router"].workers) == sorted(WORKERS)


def test_a_converged_host_touches_no_worker(host: dict[str, Any]) -> None:
    host["running"].update({u: "new" for u in host["running"]})
    instances.bring_to(host["state"])
    assert host["events"] == []


def test_a_worker_left_out_of_rotation_comes_back(host: dict[str, Any]) -> None:
    host["running"].update({u: "new" for u in host["running"]})
    host["router"].workers.remove(WORKERS[1])  # the run that took it out died there
    host["router"].workers.append("http://127.0.0.1:9999")  # and one that is no instance
    instances.bring_to(host["state"])
    assert host["events"] == [f"add_worker {WORKERS[1]}", "remove_worker http://127.0.0.1:9999"]
    assert sorted(host["router"].workers) == sorted(WORKERS)


def test_a_router_that_does_not_answer_stops_no_restart_and_fails_its_gate(
    host: dict[str, Any],
) -> None:
    host["state"]["router"]["admin"] = "http://127.0.0.1:9"  # nothing listens there
    host["state"]["routers"] = ["http://127.0.0.1:9"]
    host["state"]["health_timeout"] = 1
    with pytest.raises(systemd_units.Failed) as e:
        instances.bring_to(host["state"])
    assert host["events"] == [f"gate servefleet-vllm-{i}.service" for i in range(3)]
    assert "it finds http://127.0.0.1:8000, http://127.0.0.1:8001, http://127.0.0.1:8002 " \
           "unhealthy after 1s" in str(e.value)  # fmt: skip


def test_the_converge_ends_once_the_router_finds_every_instance_healthy(
    host: dict[str, Any],
) -> None:
    host["running"].update({u: "new" for u in host["running"]})
    host["router"].workers.remove(WORKERS[2])  # not listed yet: not routed to
    instances.bring_to(host["state"])  # puts it back, then the router finds all three healthy
    assert host["events"] == [f"add_worker {WORKERS[2]}"]


@pytest.mark.parametrize("marks", [True, False], ids=["systemd-257", "systemd-252"])
def test_one_reload_after_the_restarts_where_systemd_asks_for_it(
    host: dict[str, Any], monkeypatch: pytest.MonkeyPatch, marks: bool
) -> None:
    """Each instance is enabled with --no-reload; systemd 257 then marks it changed on disk
    (NeedDaemonReload=yes, which the next probe reads as not converged), 252 does not: the
    converge ends with one daemon-reload exactly where it is asked for."""
    reloads: list[str] = []
    gated: list[str] = []
    gate = restart_gate.start_through_gate

    def start(state: dict[str, Any], inst: dict[str, Any], restart: bool) -> None:
        gate(state, inst, restart)
        gated.append(inst["unit"])

    def show(units: list[str], *props: str) -> list[dict[str, str]]:
        marked = marks and "NeedDaemonReload" in props
        return [{"ActiveState": "active", "MainPID": "1",
                 "NeedDaemonReload": "yes" if marked and u in gated else "no"}
                for u in units]  # fmt: skip

    def systemctl(*args: str, check: bool = True) -> str:
        if args[0] == "daemon-reload":
            reloads.append(f"reload after {len(gated)} restarts")
        return ""

    monkeypatch.setattr(restart_gate, "start_through_gate", start)
    monkeypatch.setattr(systemd_units, "show", show)
    monkeypatch.setattr(systemd_units, "systemctl", systemctl)
    instances.bring_to(host["state"])
    assert reloads == (["reload after 3 restarts"] if marks else [])


def test_another_hosts_router_is_asked_with_the_admin_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """#31 finding 1: a fleet router's proxy passes the worker API only with the routers' admin
    key; the converge sends it from its 0600 root file (and no header where there is none)."""
    seen: list[str | None] = []

    class Keyed(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Keyed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        admin = f"http://127.0.0.1:{server.server_port}"
        monkeypatch.setattr(rotation, "ROUTER_ADMIN_KEY", tmp_path / "none")
        rotation.router_call(admin, "remove", WORKERS[0])
        key = tmp_path / "router-admin-key"
        key.write_text("the-admin-key-0123456789\n")
        monkeypatch.setattr(rotation, "ROUTER_ADMIN_KEY", key)
        rotation.router_call(admin, "add", WORKERS[0])
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [None, "Bearer the-admin-key-0123456789"]
