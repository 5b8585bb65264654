"""What a fleet host exposes, seen from outside it (#46 item 1): from the bridge (not a host of
the fleet), every TCP port of a host behind its own router (``serve_router = "host"``, an API
key set) is tried, and each one that answers is named and asked the paths vLLM does not guard
with its key. Only these may answer:

- sshd (22);
- the router's proxy (``serve_router_port``): OpenAI paths only (vLLM's unguarded
  ``/invocations``, ``/scale_elastic_ep``, ``/tokenize``, ``/generative_scoring``, ``/metrics``:
  404), a chat only with the key;
- the router's Prometheus metrics (``serve_router_metrics_port``), read only: the fleet's
  Prometheus scrapes it (``status --prometheus``); ``serve_host`` binds it elsewhere.

The instances (``serve_base_port``...) and vllm-router itself (``serve_router_backend_port``)
listen on loopback only. Without a router the instances answer on every address, each behind its
path guard (``serve_open_paths``): vLLM's unguarded paths 404 there too, with or without the key,
``/metrics`` (read only) excepted. The serving group's rendezvous is tried from outside and from its peer
in ``test_multinode.py``. The test prints what answered."""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from faults import REPO, run
from test_endpoints import SERVEFLEET, keyed
from test_router import MODEL, address

ROUTER = ("--data", "serve_router=host")
LIMIT = ("--limit", "lab1")
UNGUARDED = ("/invocations", "/scale_elastic_ep", "/tokenize", "/generative_scoring", "/metrics")


def open_ports(host: str) -> list[int]:
    """Every TCP port of ``host`` that takes a connection from here."""

    def takes(port: int) -> int | None:
        with socket.socket() as s:
            s.settimeout(3)
            return port if s.connect_ex((host, port)) == 0 else None

    with ThreadPoolExecutor(64) as pool:
        return [p for p in pool.map(takes, range(1, 65536)) if p is not None]


def ask(host: str, port: int, method: str, path: str, key: str | None = None) -> int:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        body = json.dumps({"model": MODEL, "max_tokens": 1,
                           "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request(method, path, body if method == "POST" else None, headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_a_host_behind_its_router_answers_outside_only_on_its_proxy_and_sshd(
    lab: dict[str, Any],
) -> None:
    key = "sk-lab-" + secrets.token_hex(24)
    where = address(lab, "lab1")
    try:
        proc = run(lab, *LIMIT, *ROUTER, env=keyed(lab, key))
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        found = open_ports(where)
        print(f"lab1 ({where}) from the bridge: TCP ports that answer: {found}")
        assert found == [22, 8080, 29000], found
        # what the plan says lab1 exposes (status --json, "exposes") is what answered
        status = subprocess.run(
            [SERVEFLEET, "status", "inventories/lab.py", "--limit", "lab1", "--json",
             "--data", "serve_router=host"], cwd=REPO, env=keyed(lab, key), capture_output=True,
            text=True, timeout=600)  # fmt: skip
        assert status.returncode == 0, status.stdout + status.stderr
        declared = json.loads(status.stdout)["lab1"]["exposes"]
        print("status --json says lab1 exposes:", *declared, sep="\n  ")
        assert [22] + sorted(e["port"] for e in declared if e["outside"]) == found
        assert {e["port"] for e in declared if not e["outside"]} >= {8000, 8001, 8002, 8003, 18080}
        proxy = {path: ask(where, 8080, method, path)
                 for path in UNGUARDED for method in ("GET", "POST")}  # fmt: skip
        print(f"the proxy at 8080 answers vLLM's unguarded paths with: {proxy}")
        assert set(proxy.values()) == {404}, proxy
        chat = "/v1/chat/completions"
        assert ask(where, 8080, "POST", chat) == 401
        assert ask(where, 8080, "POST", chat, key) == 200
        assert ask(where, 29000, "GET", "/metrics") == 200  # the router's, read only
    finally:
        back = run(lab, *LIMIT, "--data", "serve_router=none", env=keyed(lab, None))
        assert back.returncode == 0, back.stdout[-4000:] + back.stderr[-4000:]


def test_a_host_without_a_router_answers_only_its_open_paths(lab: dict[str, Any]) -> None:
    key = "sk-lab-" + secrets.token_hex(24)
    where = address(lab, "lab1")
    servers = [8000, 8001, 8002, 8003]
    try:
        proc = run(lab, *LIMIT, "--data", "serve_router=none", env=keyed(lab, key))
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        found = open_ports(where)
        print(f"lab1 ({where}) without a router, from the bridge: TCP ports that answer: {found}")
        assert found == [22, *servers], found
        status = subprocess.run(
            [SERVEFLEET, "status", "inventories/lab.py", "--limit", "lab1", "--json"], cwd=REPO,
            env=keyed(lab, key), capture_output=True, text=True, timeout=600)  # fmt: skip
        assert status.returncode == 0, status.stdout + status.stderr
        declared = json.loads(status.stdout)["lab1"]["exposes"]
        assert [22] + sorted(e["port"] for e in declared if e["outside"]) == found
        chat = "/v1/chat/completions"
        for port in servers:
            shut = {(method, path, bool(k)): ask(where, port, method, path, k)
                    for path in UNGUARDED[:-1] for method in ("GET", "POST")
                    for k in (None, key)}  # fmt: skip
            print(f"the server at {port} answers vLLM's unguarded paths with: {set(shut.values())}")
            assert set(shut.values()) == {404}, shut
            assert ask(where, port, "GET", "/metrics") == 200  # an open path, read only
            assert ask(where, port, "GET", "/health") == 200
            assert ask(where, port, "POST", chat) == 401
            assert ask(where, port, "POST", chat, key) == 200
    finally:
        back = run(lab, *LIMIT, "--data", "serve_router=none", env=keyed(lab, None))
        assert back.returncode == 0, back.stdout[-4000:] + back.stderr[-4000:]
