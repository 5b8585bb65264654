"""src/servefleet/base/remote/rotation.py in-process (#37), against a router's worker API on
127.0.0.1 (an HTTP server recording each call, its method, body and headers) or a recording
opener: the admin key read (stripped; none when missing or empty), ``add_worker`` and
``remove_worker`` with the worker quoted whole, a POST with an empty body, never through a proxy
of the environment, ten seconds at most, and their lines (done, failed); the workers the router
lists (healthy only when it says ``true``; None for any answer that is no such list, or one
over a MiB); ``bring_router``: no router wanted (its units and leftovers removed, the proxy
first), a text without its sha refused, the unit written only when it differs, a restart only
when the router does not run its sha, its gate's arguments and failure, the rotation made to
hold exactly the instances (not for P/D pools); ``wait_routed``'s deadline and line."""

from __future__ import annotations

import json
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import health  # noqa: E402
import layout  # noqa: E402
import rotation  # noqa: E402
import systemd_units  # noqa: E402

W = ["http://10.0.0.1:8000/v1?a=b&c", "http://10.0.0.2:8000"]


class Api(ThreadingHTTPServer):
    """A router's worker API: ``/workers`` answers ``answer``; each request is recorded."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes, dict[str, str]]] = []
        self.answer: tuple[int, bytes] = (200, b'{"workers": []}')
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_port}"


class _Handler(BaseHTTPRequestHandler):
    server: Api

    def log_message(self, *args: Any) -> None:
        pass

    def _record(self, method: str) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size) if size else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.server.seen.append((method, self.path, body, headers))
        code, data = self.server.answer if method == "GET" else (200, b"ok")
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self._record("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._record("POST")


@pytest.fixture
def api() -> Iterator[Api]:
    server = Api()
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the admin key would be (nothing there yet); no proxy may be used."""
    path = tmp_path / "router-admin-key"
    monkeypatch.setattr(rotation, "ROUTER_ADMIN_KEY", path)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # a proxy that answers nothing
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    return path


# --- the admin key -------------------------------------------------------------------------------
def test_the_admin_key_is_read_stripped_and_none_when_missing_or_empty(key: Path) -> None:
    assert rotation.admin_headers() == {}
    key.write_text("  \n")
    assert rotation.admin_headers() == {}
    key.write_text("s3cret\n")
    assert rotation.admin_headers() == {"Authorization": "Bearer s3cret"}


# --- the worker API ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("verb", "line"),
    [("add", "put {w} back in rotation"), ("remove", "took {w} out of rotation")],
)
def test_a_worker_call_is_a_post_with_the_worker_quoted_whole(
    verb: str, line: str, api: Api, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key.write_text("s3cret\n")
    rotation.router_call(api.url, verb, W[0])
    ((method, path, body, headers),) = api.seen
    assert (method, body) == ("POST", b"")
    assert path == f"/{verb}_worker?url={urllib.parse.quote(W[0], safe='')}"
    assert urllib.parse.parse_qs(path.partition("?")[2]) == {"url": [W[0]]}
    assert headers["authorization"] == "Bearer s3cret"
    assert capsys.readouterr().out == f"router {api.url}: {line.format(w=W[0])}\n"


def test_a_worker_call_the_router_does_not_answer_is_a_line(
    key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rotation.router_call("http://127.0.0.1:9", "remove", W[1])
    out = capsys.readouterr().out
    assert out.startswith(
        f"router http://127.0.0.1:9: remove_worker {W[1]} failed (<urlopen error "
    )
    assert out.endswith("); its health checks decide\n"), out


def test_a_worker_call_reads_at_most_64_kib_of_the_answer(
    key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The answer's body is not used: 64 KiB of it are read and no more, so a router that
    holds the rest back does not hold the call (the test releases it after)."""
    release = threading.Event()

    class Holding(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 20))
            self.end_headers()
            self.wfile.write(b"x" * (1 << 16))
            self.wfile.flush()
            release.wait(30)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Holding)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    admin = f"http://127.0.0.1:{server.server_port}"
    try:
        rotation.router_call(admin, "remove", W[1])
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert capsys.readouterr().out == f"router {admin}: took {W[1]} out of rotation\n"


class Opener:
    """What ``urllib.request.build_opener`` made: its handlers, and each open's timeout."""

    made: list[tuple[Any, ...]] = []
    opened: list[tuple[Any, float]] = []

    def __init__(self, *handlers: Any) -> None:
        Opener.made.append(handlers)

    def open(self, request: Any, timeout: float) -> Any:
        Opener.opened.append((request, timeout))
        raise OSError("recorded only")


def test_each_call_goes_direct_with_ten_seconds_at_most(
    key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Opener.made, Opener.opened = [], []
    monkeypatch.setattr(rotation.urllib.request, "build_opener", Opener)
    rotation.router_call("http://r", "add", "w")
    assert rotation.router_workers({"admin": "http://r"}) is None
    assert [len(h) for h in Opener.made] == [1, 1]
    for (handler,) in Opener.made:
        assert isinstance(handler, urllib.request.ProxyHandler) and vars(handler)["proxies"] == {}
    assert [t for _, t in Opener.opened] == [10, 10]
    post, get = (r for r, _ in Opener.opened)
    assert (post.get_method(), post.data, post.full_url) == (
        "POST",
        b"",
        "http://r/add_worker?url=w",
    )
    assert get == "http://r/workers"


@pytest.mark.parametrize(
    ("answer", "want"),
    [
        ((200, {"workers": [{"url": W[0], "is_healthy": True}, {"url": 8, "is_healthy": False}]}),
         {W[0]: True, "8": False}),
        ((200, {"workers": [{"url": W[0], "is_healthy": "true"}, {"url": W[1]}]}),
         {W[0]: False, W[1]: False}),
        ((200, {"workers": []}), {}),
        ((200, {"nodes": []}), None),
        ((200, {"workers": [{"name": W[0]}]}), None),
        ((200, {"workers": [W[0]]}), None),
        ((200, ["workers"]), None),
        ((200, b"not json"), None),
        ((503, {"workers": []}), None),
    ],
)  # fmt: skip
def test_the_workers_the_router_lists(
    answer: tuple[int, Any], want: dict[str, bool] | None, api: Api, key: Path
) -> None:
    code, body = answer
    api.answer = (code, body if isinstance(body, bytes) else json.dumps(body).encode())
    assert rotation.router_workers({"admin": api.url}) == want
    assert [(m, p) for m, p, _, _ in api.seen] == [("GET", "/workers")]


def test_a_list_of_workers_is_read_up_to_a_mib(api: Api, key: Path) -> None:
    pad = " " * ((1 << 20) - len('{"workers": []}'))
    api.answer = (200, ('{"workers": []}' + pad).encode())  # exactly a MiB
    assert rotation.router_workers({"admin": api.url}) == {}
    api.answer = (200, ('{"workers": [' + pad + " ]}").encode())  # cut at a MiB: not JSON
    assert rotation.router_workers({"admin": api.url}) is None


def test_a_router_that_does_not_answer_lists_none(key: Path) -> None:
    assert rotation.router_workers({"admin": "http://127.0.0.1:9"}) is None


# --- bring_router --------------------------------------------------------------------------------
TEXT = f'[Service]\nEnvironment="{layout.UNIT_SHA_VAR}=a1"\nExecStart=/bin/router\n'


class Systemd:
    """systemd's side: what runs (active, pid, its sha), every call recorded in ``events``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, units: Path) -> None:
        self.events: list[str] = []
        self.active, self.pid, self.sha = "active", "42", "a1"
        self.gate: str | None = None
        self.gates: list[tuple[Any, ...]] = []
        self.listed: dict[str, bool] | None = {}
        monkeypatch.setattr(systemd_units, "UNIT_DIR", units)
        monkeypatch.setattr(systemd_units, "systemctl", self.systemctl)
        monkeypatch.setattr(systemd_units, "show", self.show)
        monkeypatch.setattr(systemd_units, "daemon_reload_if_needed", self.reload)
        monkeypatch.setattr(systemd_units, "process_env", self.env)
        monkeypatch.setattr(health, "check", self.check)
        monkeypatch.setattr(health, "journal_tail", lambda unit: f"journal of {unit}")
        monkeypatch.setattr(rotation, "router_workers", lambda router: self.listed)
        monkeypatch.setattr(rotation, "router_call", self.call)
        monkeypatch.setattr(rotation, "wait_routed", self.wait)

    def systemctl(self, *args: str, check: bool = True) -> str:
        self.events.append(" ".join(args) + ("" if check else " (unchecked)"))
        return ""

    def show(self, units: list[str], *props: str) -> list[dict[str, str]]:
        """Only the properties asked, of the router's unit only."""
        values = {"MainPID": self.pid, "ActiveState": self.active}
        assert units == [rotation.ROUTER], units
        return [{p: values[p] for p in props if p in values} for _ in units]

    def reload(self, units: list[str]) -> None:
        self.events.append(f"reload-if-needed {units}")

    def env(self, pid: int) -> dict[str, str]:
        self.events.append(f"env {pid}")
        return {layout.UNIT_SHA_VAR: self.sha}

    def check(self, *args: Any, **kw: Any) -> str | None:
        self.gates.append((args, kw))
        return self.gate

    def call(self, admin: str, verb: str, worker: str) -> None:
        self.events.append(f"{verb} {worker} at {admin}")

    def wait(self, router: dict[str, Any], timeout: float) -> None:
        self.events.append(f"wait {timeout}")


def _state(**router: Any) -> dict[str, Any]:
    return {
        "model": "acme/m",
        "health_timeout": 7,
        "instances": [{"unit": "servefleet-vllm-0.service"}, {"unit": "servefleet-vllm-1.service"}],
        "router": {"sha": "a1", "text": TEXT, "port": 8080, "admin": "http://127.0.0.1:8081",
                   "workers": W, **router},
    }  # fmt: skip


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Systemd:
    units = tmp_path / "units"
    units.mkdir()
    return Systemd(monkeypatch, units)


def test_no_router_wanted_removes_its_units_proxy_first_and_their_leftovers(
    systemd: Systemd,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    units = systemd_units.UNIT_DIR
    (units / rotation.PROXY).write_text("proxy")
    (units / rotation.ROUTER).write_text("router")
    conf, admin_map = tmp_path / "proxy.conf", tmp_path / "admin.map"
    conf.write_text("x")
    admin_map.write_text("x")
    monkeypatch.setattr(layout, "PROXY_CONF", str(conf))
    monkeypatch.setattr(layout, "ROUTER_ADMIN_MAP", str(admin_map))
    rotation.bring_router({"instances": []})
    assert systemd.events == [
        f"disable --now --quiet {rotation.PROXY} (unchecked)", "daemon-reload",
        f"disable --now --quiet {rotation.ROUTER} (unchecked)", "daemon-reload",
    ]  # fmt: skip
    assert list(units.iterdir()) == [] and not conf.exists() and not admin_map.exists()
    assert capsys.readouterr().out == (
        f"{rotation.PROXY}: removed (serve_router is none)\n"
        f"{rotation.ROUTER}: removed (serve_router is none)\n"
    )
    systemd.events.clear()
    (units / rotation.ROUTER).write_text("router")  # the router's unit only, no leftovers
    rotation.bring_router({"instances": [], "router": None})
    assert systemd.events == [
        f"disable --now --quiet {rotation.ROUTER} (unchecked)",
        "daemon-reload",
    ]


def test_a_router_text_without_its_sha_is_refused(systemd: Systemd) -> None:
    with pytest.raises(systemd_units.Failed) as got:
        rotation.bring_router(_state(sha="b2"))
    assert str(got.value) == f"{rotation.ROUTER}: its text does not carry sha b2"
    assert systemd.events == []


def test_a_router_running_its_sha_is_left_running_and_its_rotation_made_whole(
    systemd: Systemd, capsys: pytest.CaptureFixture[str]
) -> None:
    systemd.listed = {W[1]: True, "http://10.0.0.9:8000": False}
    rotation.bring_router(_state())
    path = systemd_units.UNIT_DIR / rotation.ROUTER
    assert path.read_text() == TEXT
    assert capsys.readouterr().out == f"{rotation.ROUTER}: written (sha a1)\n"
    assert systemd.events == [
        f"reload-if-needed {[rotation.ROUTER]}", "env 42",
        f"add {W[0]} at http://127.0.0.1:8081",
        "remove http://10.0.0.9:8000 at http://127.0.0.1:8081", "wait 7",
    ]  # fmt: skip
    assert systemd.gates == []
    systemd.events.clear()
    before = path.stat().st_mtime_ns
    systemd.listed = None  # a router that does not answer: every worker is added
    rotation.bring_router(_state())
    assert path.stat().st_mtime_ns == before and capsys.readouterr().out == ""  # not rewritten
    assert [e for e in systemd.events if e.startswith("add")] == [
        f"add {w} at http://127.0.0.1:8081" for w in W
    ]


def test_pd_pools_are_the_routers_argv_never_its_worker_api(systemd: Systemd) -> None:
    systemd.listed = {"http://10.0.0.9:8000": True}
    rotation.bring_router(_state(pd=True))
    assert systemd.events == [f"reload-if-needed {[rotation.ROUTER]}", "env 42", "wait 7"]


@pytest.mark.parametrize(
    ("active", "pid", "sha"),
    [("inactive", "42", "a1"), ("active", "0", "a1"), ("active", "", "a1"), ("active", "42", "b2")],
)
def test_a_router_not_running_its_sha_restarts_through_its_gate(
    active: str, pid: str, sha: str, systemd: Systemd, capsys: pytest.CaptureFixture[str]
) -> None:
    systemd.active, systemd.pid, systemd.sha = active, pid, sha
    (systemd_units.UNIT_DIR / rotation.ROUTER).write_text(TEXT)
    rotation.bring_router(_state())
    assert [e for e in systemd.events if not e.startswith(("env", "add", "wait", "reload"))] == [
        f"enable --quiet {rotation.ROUTER}", f"restart {rotation.ROUTER}"
    ]  # fmt: skip
    assert systemd.gates == [
        ((rotation.ROUTER, 8080, "acme/m", 7, "127.0.0.1"),
         {"key_unit": "servefleet-vllm-0.service", "path": health.ROUTER_READY, "keyless": False})
    ]  # fmt: skip
    assert capsys.readouterr().out == (
        f"{rotation.ROUTER}: restarted (gate 7s)\n{rotation.ROUTER}: healthy on port 8080\n"
    )


def test_the_routers_gate_on_its_host_and_its_failure(systemd: Systemd) -> None:
    systemd.sha = "old"
    state = _state() | {"host": "10.0.0.5", "keyless": 1, "instances": []}
    rotation.bring_router(state)
    assert systemd.gates == [
        ((rotation.ROUTER, 8080, "acme/m", 7, "10.0.0.5"),
         {"key_unit": None, "path": health.ROUTER_READY, "keyless": True})
    ]  # fmt: skip
    systemd.gate = "no answer on /readiness"
    with pytest.raises(systemd_units.Failed) as got:
        rotation.bring_router(state)
    assert str(got.value) == f"health gate: {rotation.ROUTER}: no answer on /readiness"
    assert got.value.journal == f"journal of {rotation.ROUTER}"
    assert not [e for e in systemd.events if e.startswith("wait")][1:]


# --- wait_routed ---------------------------------------------------------------------------------
def test_wait_routed_returns_once_every_worker_is_healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[dict[str, bool] | None] = [None, {W[0]: True}, {W[0]: True, W[1]: True}]
    slept: list[float] = []
    monkeypatch.setattr(rotation, "router_workers", lambda router: answers.pop(0))
    monkeypatch.setattr(rotation.time, "sleep", slept.append)
    rotation.wait_routed({"workers": W}, 60)
    assert answers == [] and slept == [0.5, 0.5]


def test_wait_routed_fails_naming_the_unhealthy_after_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(rotation, "router_workers", lambda router: {W[0]: True, W[1]: False})
    monkeypatch.setattr(rotation.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(rotation.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    with pytest.raises(systemd_units.Failed) as got:
        rotation.wait_routed({"workers": [W[1], "http://x", W[0]]}, 2.5)
    assert str(got.value) == f"{rotation.ROUTER}: it finds {W[1]}, http://x unhealthy after 2.5s"
    assert clock[0] == 103.0  # polled until past the deadline (100 + 2.5), not at it
