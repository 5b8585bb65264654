"""The router's proxy (#31 finding 1): vllm-router 0.1.17 serves its worker API on its one port
without a key, so it listens on loopback behind nginx. The real nginx (Debian's, ./setup.sh
installs it) runs the configuration servefleet renders, in front of a stand-in for vllm-router
that records what reaches it: clients get the OpenAI paths only, streamed as they come; the
worker API answers 404 on the clients' port and, on the fleet's admin port, 401 without the
routers' admin key. The unit verifies with systemd-analyze and the plan reads what runs."""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from host_inputs import probe, settings
from lab_sim_support import free_port
from systemd_parse import parse_exec

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import PROXY_ADMIN_LOADED, PROXY_LOADED, PROXY_STARTED
from servefleet.hostplan.plan import plan_host
from servefleet.hostplan.types import Place
from servefleet.router.plan import (
    ADMIN_PATHS,
    CLIENT_PATHS,
    PROXY_MAX_BODY,
    PROXY_TIMEOUT,
    admin_map,
    render_proxy,
)
from servefleet.router.render import render_proxy_conf
from servefleet.settings.check_words import API_KEY

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
# 1024 characters, the longest allowed: mixed case and every punctuation character allowed
KEY = ("K3y.0f~The+Routers/Admin=:@%,-" + "0123456789AbCdEfGh" * 57)[:1023] + "Z"
WORKER_API = ("/add_worker?url=http%3A%2F%2F10.9.9.9%3A9", "/remove_worker?url=x", "/list_workers",
              "/workers", "/flush_cache", "/get_loads", "/v1/../add_worker?url=x", "/workers/x")  # fmt: skip

needs_nginx = pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx missing (./setup.sh)")


class Backend(http.server.ThreadingHTTPServer):
    """A stand-in for vllm-router: records each request; a streamed chat sends its second
    event only once the test has read the first (nginx must not buffer)."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        self.first_read = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Backend
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        if b'"stream": true' in body:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event, wait in ((b"data: one\n\n", True), (b"data: [DONE]\n\n", False)):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                if wait:
                    self.server.first_read.wait(10)
            self.wfile.write(b"0\r\n\r\n")
            return
        data = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _any


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[int, int, Backend]]:
    """nginx on loopback with servefleet's configuration (fleet: the admin port too), in front
    of :class:`Backend`; yields (clients' port, admin port, backend)."""
    backend = Backend()
    threading.Thread(target=backend.serve_forever, kwargs={"poll_interval": 0.05}).start()
    port, admin = free_port(), free_port()
    run = tmp_path / "run"
    run.mkdir()
    admin_map = render_proxy(fleet())[3]  # the entry the deploy writes
    assert admin_map is not None
    (run / "admin.map").write_text(admin_map)
    conf = run / "nginx.conf"
    conf.write_text(
        render_proxy_conf(
            listen=f"127.0.0.1:{port}",
            backend=f"127.0.0.1:{backend.server_address[1]}",
            paths=CLIENT_PATHS,
            admin_listen=f"127.0.0.1:{admin}",
            admin_paths=ADMIN_PATHS,
            run=str(run),
            user=None,
            version="0.1.17",
            timeout=PROXY_TIMEOUT,
            max_body=PROXY_MAX_BODY,
        )  # fmt: skip
    )
    check = subprocess.run([NGINX, "-t", "-q", "-e", "stderr", "-c", str(conf)],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert check.returncode == 0, check.stderr
    nginx = subprocess.Popen([NGINX, "-e", "stderr", "-c", str(conf), "-g", "daemon off;"],
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", admin)) == 0:
                    break
            time.sleep(0.05)
        else:
            pytest.fail("nginx did not listen within 10 s")
        yield port, admin, backend
    finally:
        nginx.terminate()
        nginx.wait(10)
        backend.shutdown()
        backend.server_close()


def ask(port: int, method: str, path: str, body: str | None = None, key: str | None = None,
        authorization: str | None = None) -> tuple[int, bytes]:  # fmt: skip
    """One request; ``key`` is sent as ``Bearer KEY``, ``authorization`` as it is."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        if authorization:
            headers["Authorization"] = authorization
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@needs_nginx
def test_clients_reach_the_openai_paths_and_never_the_worker_api(
    proxy: tuple[int, int, Backend],
) -> None:
    port, _, backend = proxy
    chat = '{"model": "m", "messages": []}'
    assert ask(port, "POST", "/v1/chat/completions", chat, key="client-key")[0] == 200
    assert backend.seen[-1] == ("POST", "/v1/chat/completions", "Bearer client-key")  # passed on
    for path in ("/v1/completions", "/v1/models", "/health", "/readiness"):
        assert ask(port, "GET", path)[0] == 200, path
    before = len(backend.seen)
    for path in WORKER_API:  # the attack of the finding: unauthenticated add_worker
        for method in ("GET", "POST"):
            assert ask(port, method, path)[0] == 404, (method, path)
    assert len(backend.seen) == before, backend.seen[before:]  # none reached vllm-router


@needs_nginx
def test_a_streamed_answer_passes_event_by_event(proxy: tuple[int, int, Backend]) -> None:
    port, _, backend = proxy
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/chat/completions", '{"stream": true}',
                     {"Content-Type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        assert response.status == 200
        assert response.read1(64) == b"data: one\n\n"  # before the backend sends the next
        backend.first_read.set()
        assert response.read() == b"data: [DONE]\n\n"
    finally:
        backend.first_read.set()
        conn.close()


@needs_nginx
def test_the_admin_port_passes_the_worker_api_only_with_the_key(
    proxy: tuple[int, int, Backend],
) -> None:
    _, admin, backend = proxy
    add = "/add_worker?url=http%3A%2F%2F10.0.0.2%3A8000"
    before = len(backend.seen)
    for key in (None, "wrong-key-0123456789", KEY + "x", KEY[:-1]):
        assert ask(admin, "POST", add, key=key)[0] == 401, key
    assert len(backend.seen) == before
    assert ask(admin, "POST", add, key=KEY)[0] == 200
    assert backend.seen[-1] == ("POST", add, f"Bearer {KEY}")  # the query as sent
    for path in ("/remove_worker?url=x", "/workers", "/list_workers"):
        assert ask(admin, "GET", path, key=KEY)[0] == 200, path
    for path in ("/v1/chat/completions", "/flush_cache", "/get_loads"):
        assert ask(admin, "POST", path, "{}", key=KEY)[0] == 404, path


@needs_nginx
def test_the_admin_key_is_compared_exactly_case_and_all(proxy: tuple[int, int, Backend]) -> None:
    """#46 item 10: nginx matched the map's string ignoring case."""
    _, admin, backend = proxy
    assert API_KEY.fullmatch(KEY) and KEY != KEY.lower() and KEY != KEY.upper()
    before = len(backend.seen)
    for said in (f"bearer {KEY}", f"BEARER {KEY}", f"bEARER {KEY}", f"Bearer {KEY.lower()}",
                 f"Bearer {KEY.upper()}", f"Bearer {KEY.swapcase()}", f"BEARER {KEY.upper()}",
                 f"bearer {KEY.lower()}", f"Bearer {KEY.replace('.', 'x', 1)}",  # . is no wildcard
                 f"Bearer k{KEY[1:]}", f"Bearer {KEY[:-1]}{KEY[-1].swapcase()}",  # one letter
                 f"Bearer  {KEY}", f"xBearer {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}"):  # fmt: skip
        assert ask(admin, "GET", "/workers", authorization=said)[0] == 401, said[:12]
    assert len(backend.seen) == before  # none reached vllm-router
    assert ask(admin, "GET", "/workers", authorization=f"Bearer {KEY}")[0] == 200


def test_the_admin_map_entry_is_a_case_sensitive_regex_of_the_key() -> None:
    assert admin_map("Ab.c~d+e/f=g:h@i%j,k-0123") == (
        r'"~^Bearer Ab\.c\~d\+e\/f\=g\:h\@i\%j\,k\-0123$" 1;' + "\n"
    )
    for bad in ('0123456789abcdef"', "0123456789abcdef\\", "0123456789 abcdef", "short"):
        with pytest.raises(DataError) as refused:
            admin_map(bad)
        assert "not shown" in str(refused.value) and bad not in str(refused.value)


def fleet(**over: Any) -> Any:
    return dataclasses.replace(settings(serve_router="fleet", **over), router_admin_key=KEY)


@pytest.mark.skipif(not Path(ANALYZE).exists(), reason="systemd-analyze missing")
def test_the_unit_verifies_and_runs_what_it_copies(tmp_path: Path) -> None:
    conf, unit, sha, admin = render_proxy(fleet())
    assert admin == admin_map(KEY)
    assert KEY not in conf and KEY not in unit  # the key lives in a 0600 file only
    path = tmp_path / "servefleet-router-proxy.service"
    path.write_text(unit)
    done = subprocess.run([ANALYZE, "verify", "--man=no", str(path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    bad = [x for x in done.stderr.splitlines() if "servefleet-router-proxy" in x]
    assert not bad, done.stderr
    lines = dict.fromkeys(x.split("=", 1)[0] for x in unit.splitlines() if "=" in x)
    assert "ExecReload" in lines and "RuntimeDirectory" in lines
    pre = [
        parse_exec(x.split("=", 1)[1]) for x in unit.splitlines() if x.startswith("ExecStartPre=")
    ]
    assert pre[0][:2] == ["/bin/sh", "-c"] and PROXY_STARTED in pre[0][2]
    assert pre[1][-1] == PROXY_LOADED and pre[2][-1] == PROXY_ADMIN_LOADED
    host = render_proxy(settings(serve_router="host"))
    assert host[3] is None and "8079" not in host[0]  # no admin port without fleet routers


def test_the_plan_restarts_or_reloads_what_runs_otherwise() -> None:
    import hashlib

    s = settings(serve_router="host")
    conf, unit, sha, _ = render_proxy(s)
    loaded = hashlib.sha256(conf.encode()).hexdigest()
    file = hashlib.sha256(unit.encode()).hexdigest()

    def proxy_of(**found: Any) -> Any:
        entry = {"active": "active", "running": sha, "loaded": loaded, "file": file,
                 "nginx": True, "admin": False, **found}  # fmt: skip
        router = {"active": "inactive", "proxy": entry}
        p = plan_host(s, probe(router=router)).router
        assert p is not None and p.proxy is not None
        return p.proxy

    now = proxy_of()
    assert now.running and now.loaded and now.nginx
    assert not proxy_of(running="0123456789abcdef").running  # started from another unit text
    assert not proxy_of(active="failed").running
    assert not proxy_of(loaded="0" * 64).loaded  # runs another configuration: a reload
    assert not proxy_of(nginx=False).nginx
    f = fleet()
    fconf, _, fsha, _ = render_proxy(f)
    entry = {
        "active": "active",
        "running": fsha,
        "loaded": hashlib.sha256(fconf.encode()).hexdigest(),
    }

    def fleet_proxy(admin: bool) -> Any:
        router = plan_host(
            f, probe(router={"proxy": {**entry, "admin": admin}}), place=Place(router_host=True)
        ).router
        assert router is not None and router.proxy is not None
        return router.proxy

    assert fleet_proxy(True).loaded and not fleet_proxy(False).loaded  # another key: a reload


def test_a_fleet_deploy_without_the_admin_key_is_refused_in_one_line() -> None:
    from servefleet.router.step import check_data

    plan = plan_host(settings(serve_router="fleet"), probe())
    with pytest.raises(DataError) as refused:
        check_data(plan)
    assert str(refused.value).startswith(
        "creds_router_admin_key_env: serve_router is fleet, and $SERVEFLEET_ROUTER_ADMIN_KEY is "
        "not set"
    )
    check_data(plan_host(fleet(), probe()))  # with it: nothing to say


@pytest.mark.parametrize("nginx", [False, True])
def test_an_nginx_the_deploy_installs_leaves_no_default_site_on_port_80(
    monkeypatch: pytest.MonkeyPatch, nginx: bool
) -> None:
    """#46 item 1 (seen from outside a lab host: port 80 answered): Debian's nginx package
    starts its own nginx.service with its default site on every address. The deploy that
    installs nginx for the proxy stops and disables it; an nginx already on the host is the
    operator's, left as it is."""
    from servefleet.router import step

    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(step.apt, "packages", lambda **kw: calls.append(("apt", kw["packages"])))
    monkeypatch.setattr(step.server, "shell", lambda **kw: calls.append(("shell", kw["commands"])))
    monkeypatch.setattr(step.ensure, "upload", lambda *a, **kw: False)
    s = settings(serve_router="host")
    conf, unit, sha, _ = render_proxy(s)
    import hashlib

    entry = {"active": "active", "running": sha, "file": hashlib.sha256(unit.encode()).hexdigest(),
             "loaded": hashlib.sha256(conf.encode()).hexdigest(), "nginx": nginx, "nft": True,
             "admin": False}  # fmt: skip
    plan = plan_host(s, probe(router={"active": "inactive", "proxy": entry}))
    step.proxy(plan)
    disable = ("shell", ["systemctl disable --now --quiet nginx.service"])
    if nginx:
        assert calls == []
    else:
        assert calls == [("apt", ["nginx"]), disable]
