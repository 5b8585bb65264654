"""Issue #17's reproducer, as a test: a deploy writing a secret, with the controller's stdin
writes delayed as a loaded controller delays them (``slow_stdin.py``). Before the fix every host
failed with ``Command socket/SSH error: OSError('Socket is closed')`` at the fact of the secret's
file: pyinfra gave the operation's ``_stdin`` to its facts too, and the fact's ``stat`` had exited
and its channel closed by the time the write came."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from faults import BARRIERS, REPO, hold, release, resolved, restart_point, run, runs_argv, secrets
from labhelpers import on_host

HOSTS = ["lab1", "lab2", "lab3"]
DEST = "/root/servefleet-test-secret"
HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("before", ["missing", "stale"])
def test_a_secret_write_survives_a_slow_controller(lab: dict[str, Any], before: str) -> None:
    for host in HOSTS:
        prepare = f"rm -f {DEST}" if before == "missing" else f"umask 077; echo old > {DEST}"
        on_host(lab, host, prepare)
    env = {**os.environ, "SECRET_DEST": DEST, "SECRET_VALUE": "s3cret", "PYINFRA_PROGRESS": "off"}
    argv = [sys.executable, str(HERE / "slow_stdin.py"), "-y", "inventories/lab.py",
            str(REPO / "tests" / "data" / "deploy_secret.py")]  # fmt: skip
    try:
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "Socket is closed" not in out, out
        for host in HOSTS:
            got = on_host(lab, host, f"stat -c %a {DEST}; cat {DEST}").stdout
            assert got == "600\ns3cret\n", (host, got)
    finally:
        for host in HOSTS:
            on_host(lab, host, f"rm -f {DEST}", check=False)


def _cut(state: dict[str, Any], host: str, cut: bool) -> None:
    """Silently drop every SSH packet of ``host`` (both ways, in its network namespace), or not:
    a network partition, no reset sent."""
    netns = next(h["netns"] for h in state["hosts"] if h["name"] == host)
    nft = ["ip", "netns", "exec", netns, "nft"]
    if cut:
        rules = ("add table inet sf_cut\n"
                 "add chain inet sf_cut input { type filter hook input priority 0; }\n"
                 "add chain inet sf_cut output { type filter hook output priority 0; }\n"
                 "add rule inet sf_cut input tcp dport 22 drop\n"
                 "add rule inet sf_cut output tcp sport 22 drop\n")  # fmt: skip
        subprocess.run([*nft, "-f", "-"], input=rules, text=True, check=True)
    else:
        subprocess.run([*nft, "delete", "table", "inet", "sf_cut"], capture_output=True)


def _ssh_sessions_to(state: dict[str, Any], host: str) -> int:
    """The controller's established TCP connections to ``host``'s sshd."""
    address = next(h["address"] for h in state["hosts"] if h["name"] == host)
    out = subprocess.run(["ss", "-Htn", "state", "established", "dst", f"{address}:22"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return len(out.splitlines())


def _wait_for(condition: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} (after {timeout} s)"
        time.sleep(0.2)


def test_a_host_whose_connection_drops_mid_batch_is_retried_and_converges(
    lab: dict[str, Any],
) -> None:
    """lab2 waits right after restarting instance 1 on a warm change; its SSH connection then goes
    silent (no reset). The deploy's keepalive finds it dead, the host is named ``connection
    lost`` with its operation, the rollout runs it once more on a new connection, and every host
    ends on the change."""
    for host in HOSTS:
        on_host(lab, host, f"rm -rf /etc/rbln-sim/fail-start /etc/rbln-sim/fail-health {BARRIERS}")
    assert run(lab).returncode == 0
    change = resolved("--set", "tool_calling=off")
    point = restart_point("servefleet-vllm-1.service", change["compile_fingerprint"])
    reached = hold(lab, ["lab2"], point)
    env = {**os.environ, **secrets(lab), "PYINFRA_PROGRESS": "off"}
    argv = [str(Path(sys.executable).parent / "servefleet"), "rollout", "inventories/lab.py",
            "--yes", "--json", "--batch-size", "3", "--", "--data",
            "serve_selection=tool_calling=off"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_for(lambda: reached() or proc.poll() is not None, "lab2 never restarted", 600)
        assert proc.poll() is None, "the rollout ended before lab2 reached its barrier"
        _cut(lab, "lab2", True)
        try:
            _wait_for(lambda: _ssh_sessions_to(lab, "lab2") == 0, "the dead connection stayed", 120)
        finally:
            _cut(lab, "lab2", False)
        release(lab, ["lab2"])
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        _cut(lab, "lab2", False)
        release(lab, HOSTS)
    assert proc.returncode == 0, out[-3000:] + err[-6000:]
    result = json.loads(out)
    assert result["lab2"]["retried"] and result["lab2"]["result"] == "ok", result
    assert not any(result[h]["retried"] for h in ("lab1", "lab3")), result
    assert all(result[h]["result"] == "ok" for h in HOSTS), result
    for host in HOSTS:
        assert all(runs_argv(lab, host, 8000 + i, change["servers"][0]["argv"]) for i in range(4))
    again = run(lab, "--json", "--data", "serve_selection=tool_calling=off")
    assert json.loads(again.stdout)["results"]["totals"]["success"] == 0
