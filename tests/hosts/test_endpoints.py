"""Endpoints on the lab fleet (issue #19): an API key from the controller's environment
(``creds_api_key_env``) reaches every server as ``VLLM_API_KEY`` through a 0600 root-owned
EnvironmentFile, the simulated vLLM then guards ``/v1`` as vLLM does (401 without the key, 200
with it, ``/health`` open), the deploy's gate and ``status`` send it, and the key is in no unit,
argv, ``systemctl show``, pyinfra output or world-readable file; a new key restarts every server.
Extra arguments and environment reach the servers, are refused in one line before any change
(an unknown flag, a flag the recipe sets), and replace the recipe's with ``serve_override_args``.
"""

from __future__ import annotations

import json
import os
import secrets as random
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from faults import PORTS, REPO, argv_watch, record, resolved, run, runs_argv, secrets, totals
from labhelpers import on_host

HOSTS = ("lab1", "lab2", "lab3")
UNITS = [f"servefleet-vllm-{i}.service" for i in range(4)]
ENV_VAR = "SERVEFLEET_API_KEY"  # creds_api_key_env's default
KEY_FILE = "/etc/servefleet/secrets/vllm-api-key.env"
MODEL = "openai/gpt-oss-120b"
SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the lab has no proxy


def keyed(state: dict[str, Any], key: str | None) -> dict[str, str]:
    """The controller's environment for a run: the lab's credentials, and the key (or none)."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env.update(secrets(state), PYINFRA_PROGRESS="off")
    return {**env, ENV_VAR: key} if key else env


def status_code(address: str, port: int, path: str, key: str | None = None) -> int:
    """What the server answers to ``path`` (a GET, or a one-token chat for the chat path)."""
    body = None
    if path == "/v1/chat/completions":
        chat = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        body = json.dumps(chat).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"http://{address}:{port}{path}", data=body, headers=headers)
    try:
        with _OPENER.open(req, timeout=30) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


# The simulator's own records (each server's argv and whole environment, 0644: what the tests
# read back, and what a real host does not have) are left out of the world-readable scan.
SIM_RECORDS = "/run/rbln-sim"
FIND_READABLE = (
    "umask 077; cat > /root/.needle; "
    f"find / \\( -path /proc -o -path /sys -o -path /dev -o -path {SIM_RECORDS} \\) -prune "
    "-o -type f -perm -o+r -size -5M -exec grep -lF -f /root/.needle {} + ; rm -f /root/.needle"
)


def leaks_on_host(state: dict[str, Any], host: str, key: str) -> list[str]:
    """Where ``key`` is on ``host`` outside the root-only key file: world-readable files, our
    unit files, ``systemctl show`` of every unit, the servers' command lines. The key goes to the
    host on stdin (never in this command's argv)."""
    found = on_host(state, host, FIND_READABLE, stdin=key + "\n", check=False).stdout.split()
    units = on_host(state, host, "cat /etc/systemd/system/servefleet-vllm-*.service").stdout
    show = on_host(state, host, "systemctl show " + " ".join(UNITS)).stdout
    cmdlines = on_host(
        state,
        host,
        "for u in " + " ".join(UNITS) + "; do "
        "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value $u)/cmdline; echo; done",
    ).stdout
    where = [f"world-readable {path}" for path in found]
    where += [what for what, text in [("units", units), ("systemctl show", show),
                                      ("argv", cmdlines)] if key in text]  # fmt: skip
    return where


def test_an_api_key_guards_every_server_and_never_leaks(lab: dict[str, Any]) -> None:
    key = "sk-lab-" + random.token_hex(24)
    try:
        assert run(lab).returncode == 0  # the default data converged: open endpoints
        with argv_watch(key) as seen:
            proc = run(lab, "-vvv", "--diff", env=keyed(lab, key))
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        assert not seen, f"the key was in a process's command line: {seen[:3]}"
        assert key not in proc.stdout + proc.stderr, "the key is in pyinfra's output"
        assert "Write the servers' API key (0600)" in proc.stdout + proc.stderr

        for host in lab["hosts"]:
            address = host["address"]
            for port in PORTS:
                assert status_code(address, port, "/health") == 200  # open, as in vLLM
                assert status_code(address, port, "/v1/chat/completions") == 401
                assert status_code(address, port, "/v1/models") == 401
                assert status_code(address, port, "/v1/chat/completions", "sk-" + "0" * 20) == 401
                assert status_code(address, port, "/v1/chat/completions", key) == 200
                assert status_code(address, port, "/v1/models", key) == 200
        for host in HOSTS:
            assert on_host(lab, host, f"stat -c '%a %U %G' {KEY_FILE} /etc/servefleet/secrets"
                           ).stdout.split("\n")[:2] == ["600 root root", "700 root root"]  # fmt: skip
            units = on_host(lab, host, "cat /etc/systemd/system/servefleet-vllm-*.service").stdout
            assert units.count(f"EnvironmentFile={KEY_FILE}\n") == 4
            assert leaks_on_host(lab, host, key) == [], host
            rec = record(lab, host, 8000)
            assert rec is not None and "--api-key" not in rec["argv"]

        # status judges with the deploy's gate: it sends the key, and the fleet is healthy
        status = subprocess.run(
            [SERVEFLEET, "status", "inventories/lab.py"], cwd=REPO, env=keyed(lab, key),
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert status.returncode == 0, status.stdout + status.stderr
        assert key not in status.stdout + status.stderr
        # a second run changes nothing (the probe watches the key file by its hash)
        assert totals(run(lab, "--json", env=keyed(lab, key)))["success"] == 0

        # a new key: every server restarts through the gate with it; the old one is refused
        new = "sk-lab-" + random.token_hex(24)
        shas = "grep -h SERVEFLEET_UNIT /etc/systemd/system/servefleet-vllm-*.service"
        before = on_host(lab, HOSTS[0], shas).stdout
        rotated = run(lab, env=keyed(lab, new))
        assert rotated.returncode == 0, rotated.stdout[-4000:] + rotated.stderr[-4000:]
        # #31 finding 4: the units' world-readable hash carries nothing of the key
        assert on_host(lab, HOSTS[0], shas).stdout == before
        for host in lab["hosts"]:
            for port in PORTS:
                assert status_code(host["address"], port, "/v1/chat/completions", key) == 401
                assert status_code(host["address"], port, "/v1/chat/completions", new) == 200
    finally:
        back = run(lab, env=keyed(lab, None))  # no key: the units name no file, open again
    assert back.returncode == 0, back.stdout[-4000:] + back.stderr[-4000:]
    for host in lab["hosts"]:
        assert status_code(host["address"], 8000, "/v1/chat/completions") == 200
        units = on_host(lab, host["name"], "cat /etc/systemd/system/servefleet-vllm-*.service")
        assert "EnvironmentFile=" not in units.stdout


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``servefleet:`` line of a run that bad data stopped."""
    assert proc.returncode != 0
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "servefleet:" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return errors[0]


def unit_files(state: dict[str, Any]) -> dict[str, str]:
    return {h: on_host(state, h, "cat /etc/systemd/system/servefleet-vllm-*.service").stdout
            for h in HOSTS}  # fmt: skip


def test_extra_args_and_env_reach_the_servers_refused_and_overridden(lab: dict[str, Any]) -> None:
    base = resolved()["servers"][0]["argv"]
    extra = ["--enable-log-requests", "--max-log-len", "100"]
    try:
        assert run(lab).returncode == 0
        accepted = run(
            lab,
            "--limit", "lab1",
            "--data", "serve_extra_args=" + " ".join(extra),
            "--data", "serve_extra_env=VLLM_LOGGING_LEVEL=DEBUG",
        )  # fmt: skip
        assert accepted.returncode == 0, accepted.stdout[-4000:] + accepted.stderr[-4000:]
        for port in PORTS:
            assert runs_argv(lab, "lab1", port, [*base, *extra]), port
            rec = record(lab, "lab1", port)
            assert rec is not None and rec["env"]["VLLM_LOGGING_LEVEL"] == "DEBUG"
            address = next(h["address"] for h in lab["hosts"] if h["name"] == "lab1")
            assert status_code(address, port, "/v1/chat/completions") == 200
        assert runs_argv(lab, "lab2", 8000, base), "--limit lab1 changed lab2"

        # refused in one line, before any host changes
        before = unit_files(lab)
        for data, message in [
            ("serve_extra_args=--max-num-seq 2", "serve_extra_args: --max-num-seq is not a flag "
             "of vllm serve (vLLM 0.30.0 with vllm-rbln 0.12.0); did you mean --max-num-seqs?"),
            ("serve_extra_args=--max-num-seqs 2", "serve_extra_args: --max-num-seqs is set by the "
             "recipe already (--max-num-seqs 1); allowed: add --max-num-seqs to "
             "serve_override_args to replace the recipe's value"),
            ("serve_extra_env=VLLM_ENGINE_READY_TIMEOUT_S=60", "serve_extra_env: "
             "VLLM_ENGINE_READY_TIMEOUT_S is set by the recipe already"),
        ]:  # fmt: skip
            assert message in one_error(run(lab, "--data", data))
        assert unit_files(lab) == before

        # overridden: the extra value replaces the recipe's (it recompiles: a compile input)
        over = run(
            lab,
            "--limit", "lab1",
            "--data", "serve_extra_args=--max-num-seqs 2",
            "--data", "serve_override_args=--max-num-seqs",
        )  # fmt: skip
        assert over.returncode == 0, over.stdout[-4000:] + over.stderr[-4000:]
        at = base.index("--max-num-seqs")
        want = [*base[:at], *base[at + 2 :], "--max-num-seqs", "2"]
        assert all(runs_argv(lab, "lab1", port, want) for port in PORTS)
    finally:
        back = run(lab)  # the default data: the recipe's own argv again
    assert back.returncode == 0, back.stdout[-4000:] + back.stderr[-4000:]
    assert all(runs_argv(lab, "lab1", port, base) for port in PORTS)
