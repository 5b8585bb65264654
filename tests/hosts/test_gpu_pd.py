"""Prefill/decode across hosts (#21): GLM-5.2's ``pd_cluster`` strategy from vLLM's recipes on
two H200 hosts, prefill on lab1 and decode on lab2 (``serve_roles``), behind a fleet router on
lab3. Each role runs the resolved argv (the site builder's) with its placeholders bound, plus
what the deploy adds; a chat through the router goes prefill, then decode (the simulated servers' per-role
counters); a killed prefill is named by ``status``, and the next deploy converges, the decode re-checked
(and restarted: the simulator's stale-peer switch keeps a restarted peer's old engine)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from faults import run
from labhelpers import on_host, relabbed, servefleet
from test_plan_status import cli
from test_router import STALE, address, healthy, request, role_counts, stale_read, started_at

DATA = [
    "serve_recipe=vllm/zai-org/GLM-5.2",
    "serve_strategy=pd_cluster",
    "serve_hardware=h200",
    "serve_router=fleet",
    'serve_roles={"prefill": "prefill", "decode": "decode"}',
]
MODEL = "zai-org/GLM-5.2-FP8"


@pytest.fixture
def pd_lab(lab: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Three H200 hosts: lab1 in the group prefill, lab2 in decode, lab3 in router; the session
    lab comes back as it was after."""
    with relabbed(lab, "--hosts", "3", "--hardware", "h200", "--group", "prefill=lab1",
                  "--group", "decode=lab2", "--group", "router=lab3") as three:  # fmt: skip
        yield three


def deploy(lab: dict[str, Any]) -> None:
    proc = run(lab, *(a for d in DATA for a in ("--data", d)))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]


def resolved() -> dict[str, Any]:
    """What ``servefleet resolve`` gives GLM-5.2's pd_cluster on H200: the site builder's
    prefill and decode commands (the site prints no H200 entry for it; test_pd_roles holds
    resolve equal to each of the site's 30 pd_cluster entries)."""
    out = servefleet("resolve", "vllm/zai-org/GLM-5.2", "--strategy", "pd_cluster",
                     "--hardware", "h200", "--format", "json").stdout  # fmt: skip
    return {s["role"]: s for s in json.loads(out)["servers"]}


def recorded(lab: dict[str, Any], host: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the host's server, as its process has them."""
    pid = "$(systemctl show -p MainPID --value servefleet-vllm-0.service)"
    argv = on_host(lab, host, f"cat /proc/{pid}/cmdline").stdout.split("\0")[:-1]
    if argv and argv[0].endswith("/bin/python"):  # the console script's interpreter
        argv = argv[1:]
    env = on_host(lab, host, f"cat /proc/{pid}/environ").stdout.split("\0")[:-1]
    return argv, dict(e.split("=", 1) for e in env)


def test_glm_prefill_and_decode_on_two_h200_hosts_behind_a_fleet_router(
    pd_lab: dict[str, Any],
) -> None:
    lab = pd_lab
    on_host(lab, "lab2", f"touch {STALE}")  # its decode keeps a peer's first NIXL engine
    deploy(lab)
    front, p_addr, d_addr = address(lab, "lab3"), address(lab, "lab1"), address(lab, "lab2")
    conn_workers = healthy(lab, "lab3")
    assert conn_workers == {f"http://{p_addr}:8000": True, f"http://{d_addr}:8000": True}

    site = resolved()
    bound = {"$PREFILL_NODE_1": p_addr, "$DECODE_NODE_1": d_addr}
    for host, role in (("lab1", "prefill"), ("lab2", "decode")):
        argv, env = recorded(lab, host)
        want = site[role]["argv"]
        assert argv[0].endswith("/bin/vllm") and argv[1:] == [
            *want[1:], "--port", "8000", "--shutdown-timeout", "60",
            "--middleware", "servefleet_paths.OpenPaths",
        ], (argv, want)  # fmt: skip
        for name, value in site[role]["env"].items():
            assert env[name] == bound.get(value, value), (name, env.get(name))

    before = (role_counts(lab, "lab1", 8000), role_counts(lab, "lab2", 8000))
    assert request(front, stream=False, model=MODEL) is None
    after = (role_counts(lab, "lab1", 8000), role_counts(lab, "lab2", 8000))
    assert after[0]["prefill"] - before[0]["prefill"] == 1  # lab1 prefilled it ...
    assert after[1]["decode"] - before[1]["decode"] == 1  # ... and lab2 decoded it

    # the prefill server killed (and kept down): status names it; the next deploy converges,
    # and the decode, which fails a request from the restarted prefill, restarts
    decoded = started_at(lab, "lab2", "servefleet-vllm-0.service")
    on_host(lab, "lab1", "systemctl kill --signal=SIGKILL servefleet-vllm-0.service; "
            "systemctl stop servefleet-vllm-0.service")  # fmt: skip
    status = cli(lab, "status", "inventories/lab.py", *(a for d in DATA for a in ("--data", d)))
    assert status.returncode == 1
    assert "servefleet: lab1: servefleet-vllm-0.service drifts" in status.stderr, status.stderr
    deploy(lab)
    assert started_at(lab, "lab2", "servefleet-vllm-0.service") > decoded
    assert stale_read(lab, "lab2", "servefleet-vllm-0.service")
    assert request(front, stream=False, model=MODEL) is None
    again = cli(lab, "status", "inventories/lab.py", *(a for d in DATA for a in ("--data", d)))
    assert again.returncode == 0, again.stdout + again.stderr
