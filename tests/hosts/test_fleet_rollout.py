"""`servefleet rollout` on a 4-host lab (destructive: it re-ups the lab with 4 hosts and leaves
a default 3-host lab behind): batches in inventory order with a canary, a failing canary stops
the rollout and rolls back, a host that disappears, and a controller killed mid-batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from faults import REPO, hold, release, resolved, restart_point, run, runs_argv, secrets
from labhelpers import lab_up, on_host, servefleet

from servefleet.fleet.lab.chat import chat_once

pytestmark = pytest.mark.lab_destructive

HOSTS = ["lab1", "lab2", "lab3", "lab4"]
PORTS = [8000 + i for i in range(4)]
SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
LATENCY = resolved()["servers"][0]["argv"]
THROUGHPUT_SPEC = resolved("--target", "throughput")
THROUGHPUT = THROUGHPUT_SPEC["servers"][0]["argv"]


def wait_for(condition: Any, what: str, timeout: float = 120) -> None:
    """Poll ``condition()`` until it holds; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} (after {timeout} s)"
        time.sleep(0.2)


def rollout(state: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **secrets(state), "PYINFRA_PROGRESS": "off"}
    return subprocess.run([SERVEFLEET, "rollout", "inventories/lab.py", "--yes", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1800)  # fmt: skip


def serving(state: dict[str, Any], host: str) -> int:
    address = next(h["address"] for h in state["hosts"] if h["name"] == host)
    n = 0
    for port in PORTS:
        try:
            n += bool(chat_once(address, port, "openai/gpt-oss-120b", "hi", max_tokens=1))
        except Exception:  # noqa: BLE001 - not serving on that port right now
            pass
    return n


def units_and_releases(state: dict[str, Any], host: str) -> str:
    return on_host(
        state,
        host,
        "cat /etc/systemd/system/servefleet-vllm-*.service; "
        "ls /opt/servefleet/releases; readlink /opt/servefleet/current",
    ).stdout


def refuse_ssh(state: dict[str, Any], host: str, refuse: bool) -> None:
    """Make ``host``'s sshd refuse new connections (a table in its network namespace), or not."""
    netns = next(h["netns"] for h in state["hosts"] if h["name"] == host)
    nft = ["ip", "netns", "exec", netns, "nft"]
    if refuse:
        rules = ("add table inet sf_gone\n"
                 "add chain inet sf_gone input { type filter hook input priority 0; }\n"
                 "add rule inet sf_gone input tcp dport 22 ct state new reject with tcp reset\n")  # fmt: skip
        subprocess.run([*nft, "-f", "-"], input=rules, text=True, check=True)
    else:
        subprocess.run([*nft, "delete", "table", "inet", "sf_gone"], capture_output=True)


def test_rollouts_on_four_hosts(lab: dict[str, Any]) -> None:
    try:
        state = lab_up("--hosts", "4")
        first = run(state)
        assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-6000:]
        # batches in inventory order, a canary first; all hosts end on the change
        done = rollout(state, "--canary", "1", "--batch-size", "2", "--",
                       "--data", "serve_target=Throughput")  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        assert "batch 1/3: lab1\n" in done.stdout
        assert "batch 2/3: lab2, lab3\n" in done.stdout and "batch 3/3: lab4\n" in done.stdout
        for host in HOSTS:
            assert all(runs_argv(state, host, p, THROUGHPUT) for p in PORTS), host
        again = rollout(state, "--canary", "1", "--batch-size", "2", "--json", "--",
                        "--data", "serve_target=Throughput")  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        per_host = json.loads(again.stdout)
        assert all(r["result"] == "ok" and r["release_before"] == r["release_after"]
                   for r in per_host.values())  # fmt: skip
        noop = run(state, "--json", "--data", "serve_target=Throughput")
        assert json.loads(noop.stdout)["results"]["totals"]["success"] == 0

        # the canary fails its gate on the new selection: stop, canary rolled back, rest untouched
        before = {h: units_and_releases(state, h) for h in HOSTS[1:]}
        on_host(state, "lab1", "echo '--max-num-seqs 1 ' > /etc/rbln-sim/fail-health")
        try:
            failed = rollout(state, "--canary", "1", "--batch-size", "2", "--json", "--",
                             "--data", "serve_health_timeout=8")  # fmt: skip
        finally:
            on_host(state, "lab1", "rm -f /etc/rbln-sim/fail-health")
        assert failed.returncode == 1
        result = json.loads(failed.stdout)
        assert result["lab1"]["result"] == "failed" and result["lab1"]["rolled_back"]
        assert result["lab1"]["release_after"] == result["lab1"]["release_before"]
        assert all(result[h]["result"] == "not reached" for h in HOSTS[1:])
        assert all(runs_argv(state, "lab1", p, THROUGHPUT) for p in PORTS)
        assert serving(state, "lab1") == 4
        assert {h: units_and_releases(state, h) for h in HOSTS[1:]} == before

        # a host that disappears (its sshd refuses every connection until the rollout is over)
        # is reported; the rest go on
        refuse_ssh(state, "lab3", True)
        try:
            wait_for(lambda: servefleet("lab", "ssh", "lab3", "true", check=False).returncode != 0,
                     "lab3 still answers SSH", timeout=30)  # fmt: skip
            gone = rollout(state, "--batch-size", "1", "--max-failures", "1", "--json")
        finally:
            refuse_ssh(state, "lab3", False)
        assert gone.returncode == 0, gone.stdout[-3000:] + gone.stderr[-3000:]
        result = json.loads(gone.stdout)
        assert result["lab3"]["result"] == "failed"
        for host in ("lab1", "lab2", "lab4"):
            assert result[host]["result"] == "ok"
            assert all(runs_argv(state, host, p, LATENCY) for p in PORTS), host
        wait_for(lambda: servefleet("lab", "ssh", "lab3", "true", check=False).returncode == 0,
                 "lab3's sshd did not come back")  # fmt: skip

        # the controller killed mid-batch (lab1 and lab2 wait right after restarting instance 1
        # on the change): every host keeps serving; running again converges
        low: dict[str, int] = {}
        rounds = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                for host in HOSTS:
                    low[host] = min(low.get(host, 4), serving(state, host))
                rounds[0] += 1
                time.sleep(0.3)

        point = restart_point("servefleet-vllm-1.service", THROUGHPUT_SPEC["compile_fingerprint"])
        reached = hold(state, ["lab1", "lab2"], point)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        env = {**os.environ, **secrets(state), "PYINFRA_PROGRESS": "off"}
        args = ["--yes", "--batch-size", "2", "--", "--data", "serve_target=Throughput"]
        try:
            proc = subprocess.Popen([SERVEFLEET, "rollout", "inventories/lab.py", *args],
                                    cwd=REPO, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)  # fmt: skip
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("batch 1/2: lab1, lab2") and "ok" not in line:
                    wait_for(lambda: reached() or proc.poll() is not None,
                             "lab1 and lab2 did not restart instance 1", timeout=600)  # fmt: skip
                    assert proc.poll() is None, "the rollout ended before the fault point"
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
            proc.wait()
            killed = rounds[0]
            wait_for(lambda: rounds[0] >= killed + 2, "the sampler stopped")  # after the kill
        finally:
            stop.set()
            release(state, ["lab1", "lab2"])
        sampler.join()
        assert all(low.get(h, 0) >= 1 for h in HOSTS), f"a host served nothing: {low}"
        again = rollout(state, "--batch-size", "2", "--", "--data", "serve_target=Throughput")
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        for host in HOSTS:
            assert all(runs_argv(state, host, p, THROUGHPUT) for p in PORTS), host
    finally:
        lab.clear()
        lab.update(lab_up())
