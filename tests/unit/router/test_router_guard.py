"""vllm-router's worker API is open to any local user on loopback (#46 item 9): 0.1.17 checks no
key there and listens on no Unix socket, so a local user could ``POST /add_worker`` and take
clients' requests. The router's unit loads an nftables table first that resets a loopback
connection to its port from any user but root and the router's own (nginx's workers). Here the
real nft and the real vllm-router run the unit's own commands in a network namespace of the
test's: a request as ``nobody`` is refused, as root and as the router's user it is answered.
Before the fix the unit had no such ``ExecStartPre=``: the first assertion failed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from host_inputs import probe, settings
from lab_sim_support import free_port
from systemd_parse import parse_exec

from servefleet.base.remote.layout import NFT, ROUTER_GUARD_TABLE
from servefleet.hostplan.plan import plan_host
from servefleet.router.plan import plan_proxy

ROUTER = Path(sys.executable).parent / "vllm-router"  # the dev extra's (pyproject)
ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
ROUTER_USER = "daemon"  # a user of every Debian: the router's in the namespace test


def guard_of(text: str) -> list[str]:
    """The argv of the unit's one ``ExecStartPre=+`` (run as root, whatever ``User=`` says)."""
    pre = [x.split("=", 1)[1] for x in text.splitlines() if x.startswith("ExecStartPre=")]
    assert len(pre) == 1 and pre[0].startswith("+"), pre
    return parse_exec(pre[0][1:])


def test_the_router_unit_loads_its_guard_as_root_before_it_starts() -> None:
    r = plan_host(settings(serve_router="host"), probe()).router
    assert r is not None
    argv = guard_of(r.text)
    assert argv[0] == NFT and len(argv) == 2
    rules = argv[1]
    # one transaction: the table made anew, so a restart replaces it, never adds a second rule
    assert rules.startswith(f"add table inet {ROUTER_GUARD_TABLE}; delete table inet ")
    assert "oif lo tcp dport 18080 " in rules and "reject with tcp reset" in rules
    assert 'meta skuid != { 0, "servefleet-router" }' in rules
    other = plan_host(settings(serve_router="host", serve_router_backend_port=18099), probe())
    assert other.router is not None and "tcp dport 18099 " in guard_of(other.router.text)[1]
    assert other.router.sha != r.sha  # another guard is another unit text: it restarts
    # the deploy installs nft where the probe found none (with nginx, from the host's mirror)
    assert r.proxy is not None and not r.proxy.nft
    assert plan_proxy(settings(serve_router="host"), {"nft": True}).nft


@pytest.mark.skipif(not Path(ANALYZE).exists(), reason="systemd-analyze missing")
def test_systemd_reads_the_guard_line(tmp_path: Path) -> None:
    r = plan_host(settings(serve_router="host"), probe()).router
    assert r is not None
    path = tmp_path / "servefleet-router.service"
    path.write_text(r.text)
    done = subprocess.run([ANALYZE, "verify", "--man=no", str(path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    # the release's vllm-router is not on this machine; nothing else may be wrong with the unit
    bad = [x for x in done.stderr.splitlines()
           if "servefleet-router" in x and "vllm-router" not in x]  # fmt: skip
    assert not bad, done.stderr


# Run in a network namespace of its own (as root): lo up, the unit's guard, the real vllm-router
# on the unit's port, then a worker API request from each user (a forked child that became it).
IN_NETNS = textwrap.dedent(
    """
    import json, os, pwd, subprocess, sys, time, urllib.request

    guard, router, port, users = json.loads(sys.argv[1])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(guard, check=True)
    base = "http://127.0.0.1:%d" % port
    proc = subprocess.Popen([router, "--host", "127.0.0.1", "--port", str(port),
                             "--worker-urls", "--prometheus-host", "127.0.0.1",
                             "--prometheus-port", str(port + 1)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def ask(path, method):
        req = urllib.request.Request(base + path, method=method)
        try:
            with opener.open(req, timeout=3) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError as e:
            return type(getattr(e, "reason", e)).__name__

    try:
        for _ in range(100):
            if ask("/list_workers", "GET") == 200:
                break
            time.sleep(0.1)
        out = {}
        for user in users:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                if user != "root":
                    entry = pwd.getpwnam(user)
                    os.setgroups([])
                    os.setgid(entry.pw_gid)
                    os.setuid(entry.pw_uid)
                got = [ask("/list_workers", "GET"),
                       ask("/add_worker?url=http%3A%2F%2F127.0.0.1%3A9", "POST")]
                os.write(w, json.dumps(got).encode())
                os._exit(0)
            os.close(w)
            os.waitpid(pid, 0)
            out[user] = json.loads(os.read(r, 4096))
        print(json.dumps(out))
    finally:
        proc.kill()
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace and nft need root")
@pytest.mark.skipif(not Path(NFT).exists(), reason="nft missing (./setup.sh)")
@pytest.mark.skipif(not ROUTER.exists(), reason="no vllm-router beside this Python")
def test_only_root_and_the_router_user_reach_the_worker_api() -> None:
    port = free_port()
    s = settings(serve_router="host", serve_router_user=ROUTER_USER, serve_router_backend_port=port)
    r = plan_host(s, probe()).router
    assert r is not None
    args = json.dumps([guard_of(r.text), str(ROUTER), port, ["root", ROUTER_USER, "nobody"]])
    done = subprocess.run(["unshare", "--net", sys.executable, "-c", IN_NETNS, args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"no network namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["root"][0] == 200 and got[ROUTER_USER][0] == 200, got
    # nobody's connection is reset at its first packet: neither a read nor a change gets through
    assert got["nobody"] == ["ConnectionRefusedError", "ConnectionRefusedError"], got
