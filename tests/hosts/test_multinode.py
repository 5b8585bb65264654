"""One model across two H200 hosts (#34): DeepSeek-V3.2's ``multi_node_tp_pp`` from vLLM's
recipes as serving group g1 (rank 0 on lab1 serves the API, rank 1 on lab2 runs headless). Each
rank runs the argv ``servefleet resolve`` gives its rank, ``$HEAD_IP`` and ``$IFACE_NAME`` bound;
the simulated ranks form their group over TCP as vLLM's do, so a chat through rank 0 answers
only once both joined. A re-run changes nothing; ``status`` judges the headless rank by its
unit and the group as one. A killed worker takes the head down with it (vLLM is fail-stop), a
killed head leaves the worker hanging (vllm#32136): the next deploy restarts the group as one
either way. A deploy killed between the group's stop and start, or between its start and its
gate, converges on the next run. Then the same two hosts switch to ``multi_node_dep``, where
every rank serves its own API (``--data-parallel-hybrid-lb``)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from faults import changed_ops, run, run_killed
from labhelpers import on_host, relabbed, servefleet, wait_for
from test_plan_status import cli

from servefleet.fleet.lab.chat import chat_once

RECIPE = "vllm/deepseek-ai/DeepSeek-V3.2"
MODEL = "deepseek-ai/DeepSeek-V3.2"
UNIT = "servefleet-vllm-0.service"
HOSTS = ("lab1", "lab2")
DRAIN = ["--shutdown-timeout", "60"]  # what the deploy adds (serve_shutdown_timeout)
GUARD = ["--middleware", "servefleet_paths.OpenPaths"]  # and on a rank that serves (#46)


def data(strategy: str) -> list[str]:
    keys = [f"serve_recipe={RECIPE}", f"serve_strategy={strategy}", "serve_hardware=h200",
            "serve_group=g1"]  # fmt: skip
    return [a for d in keys for a in ("--data", d)]


@pytest.fixture
def two_h200(lab: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Two H200 hosts; the session lab comes back as it was after."""
    with relabbed(lab, "--hosts", "2", "--hardware", "h200") as two:
        yield two


def address(lab: dict[str, Any], host: str) -> str:
    return next(h["address"] for h in lab["hosts"] if h["name"] == host)


def ranks(strategy: str) -> list[dict[str, Any]]:
    """``servefleet resolve``'s servers, one per rank."""
    out = servefleet("resolve", RECIPE, "--strategy", strategy, "--hardware", "h200",
                     "--format", "json").stdout  # fmt: skip
    return json.loads(out)["servers"]


def process(lab: dict[str, Any], host: str) -> tuple[int, list[str], dict[str, str]]:
    """The main process of the host's server unit: its pid, argv and environment."""
    pid = int(on_host(lab, host, f"systemctl show -p MainPID --value {UNIT}").stdout)
    assert pid, f"{host}: {UNIT} runs nothing"
    argv = on_host(lab, host, f"cat /proc/{pid}/cmdline").stdout.split("\0")[:-1]
    if argv and argv[0].endswith("/bin/python"):  # the console script's interpreter
        argv = argv[1:]
    env = on_host(lab, host, f"cat /proc/{pid}/environ").stdout.split("\0")[:-1]
    return pid, argv, dict(e.split("=", 1) for e in env)


def nic(lab: dict[str, Any], host: str) -> str:
    """The interface carrying the host's address (what ``$IFACE_NAME`` binds to)."""
    out = on_host(lab, host, "ip -o -4 addr show").stdout
    return next(f.split()[1] for f in out.splitlines() if f" {address(lab, host)}/" in f)


def pid_of(lab: dict[str, Any], host: str) -> int:
    return int(on_host(lab, host, f"systemctl show -p MainPID --value {UNIT}").stdout)


def active(lab: dict[str, Any], host: str) -> str:
    return on_host(lab, host, f"systemctl is-active {UNIT}", check=False).stdout.strip()


def answers(lab: dict[str, Any], host: str) -> bool:
    try:
        return bool(chat_once(address(lab, host), 8000, MODEL, "hi", max_tokens=1))
    except OSError:
        return False


def deploy(lab: dict[str, Any], strategy: str) -> list[str]:
    """A deploy that must pass; the operations that changed something."""
    proc = run(lab, "--json", *data(strategy))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return changed_ops(proc)


def status(lab: dict[str, Any], strategy: str, *extra: str) -> Any:
    return cli(lab, "status", "inventories/lab.py", *data(strategy), *extra)


def check_serving(lab: dict[str, Any], strategy: str) -> None:
    """Each rank runs resolve's argv for it, bound; rank 0 answers a chat."""
    head = address(lab, "lab1")
    for host, rank in zip(HOSTS, ranks(strategy), strict=True):
        _, argv, env = process(lab, host)
        want = [head if w == "$HEAD_IP" else w for w in rank["argv"]]
        headless = "--headless" in want
        port, guard = ([], []) if headless else (["--port", "8000"], GUARD)
        assert argv[0].endswith("/bin/vllm") and argv[1:] == [*want[1:], *port, *DRAIN, *guard], (
            host, argv, want)  # fmt: skip
        for name, value in rank["env"].items():
            assert env[name] == (nic(lab, host) if value == "$IFACE_NAME" else value), name
    assert answers(lab, "lab1")


def connects_from_here(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return False
    return True


def check_rendezvous_guard(lab: dict[str, Any]) -> None:
    """#46 item 7: the head's rendezvous (torch's TCPStore, 29501) answers the group's other
    host, and resets a connection from anywhere else (here: the bridge, outside the group); the
    group still serves after both tries."""
    head = address(lab, "lab1")
    for host in HOSTS:
        on_host(lab, host, "nft list table inet servefleet_group")
    peer = on_host(lab, "lab2", "python3 -c \"import socket; socket.create_connection(("
                   f"'{head}', 29501), timeout=5).close()\"", check=False)  # fmt: skip
    outside = {port: connects_from_here(head, port) for port in (29500, 29501, 29550)}
    print(f"rendezvous of g1 at {head}: from lab2 (a peer) 29501 answered: "
          f"{peer.returncode == 0}; from the bridge: {outside}")  # fmt: skip
    assert peer.returncode == 0, peer.stderr
    assert outside == {29500: False, 29501: False, 29550: False}
    # a collective's listener (NCCL's bootstrap, Gloo: an ephemeral port) likewise
    on_host(lab, "lab1", "timeout 60 python3 -c \"import socket,time; s=socket.create_server("
            "('0.0.0.0', 40123)); time.sleep(60)\" >/dev/null 2>&1 &")  # fmt: skip
    deadline = time.monotonic() + 30
    peer = on_host(lab, "lab2", "python3 -c \"import socket; socket.create_connection(("
                   f"'{head}', 40123), timeout=5).close()\"", check=False)  # fmt: skip
    while peer.returncode != 0 and time.monotonic() < deadline:  # the listener is starting
        time.sleep(0.2)
        peer = on_host(lab, "lab2", "python3 -c \"import socket; socket.create_connection(("
                       f"'{head}', 40123), timeout=5).close()\"", check=False)  # fmt: skip
    assert peer.returncode == 0, peer.stderr
    assert not connects_from_here(head, 40123)
    on_host(lab, "lab1", "pkill -f 'create_server..0.0.0.0., 40123' || true", check=False)
    assert answers(lab, "lab1")


def test_tp_pp_across_two_h200_hosts_restarts_as_one_group(
    two_h200: dict[str, Any], tmp_path: Any
) -> None:
    lab, tp_pp = two_h200, "multi_node_tp_pp"
    deploy(lab, tp_pp)
    check_serving(lab, tp_pp)
    assert not answers(lab, "lab2")  # the headless rank serves no API
    check_rendezvous_guard(lab)
    assert deploy(lab, tp_pp) == []  # a re-run changes nothing
    table = status(lab, tp_pp)
    assert table.returncode == 0, table.stdout + table.stderr
    assert "rank 0 lab1 (port 8000): runs the group's hash, ok; rank 1 lab2 (headless): runs " \
        "the group's hash, ok" in table.stdout, table.stdout  # fmt: skip
    prom = tmp_path / "targets.json"
    ok = status(lab, tp_pp, "--prometheus", str(prom), "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    seen = json.loads(ok.stdout)
    assert seen["lab2"]["instances"][0]["headless"] and seen["lab2"]["group"]["rank"] == 1
    assert [t for g in json.loads(prom.read_text()) for t in g["targets"]] == [
        f"{address(lab, 'lab1')}:8000"  # the headless rank is no scrape target
    ]

    # the worker killed: the head's engine dies and its API server exits (fail-stop)
    on_host(lab, "lab2", f"systemctl kill --signal=SIGKILL {UNIT}")
    wait_for(lambda: active(lab, "lab1") != "active", "rank 0 stops once rank 1 died")
    down = status(lab, tp_pp)
    assert down.returncode == 1
    assert "servefleet: group g1 (lab1, lab2) does not serve: lab1 (rank 0), lab2 (rank 1)" in (
        down.stderr), down.stderr  # fmt: skip
    assert "lab2: servefleet-vllm-0.service (a headless rank) unhealthy" in down.stderr
    deploy(lab, tp_pp)
    check_serving(lab, tp_pp)

    # the head killed: the worker hangs, alive, and would never rejoin; the deploy restarts it
    hung = pid_of(lab, "lab2")
    on_host(lab, "lab1", f"systemctl kill --signal=SIGKILL {UNIT}")
    wait_for(lambda: active(lab, "lab1") == "failed", "rank 0 failed")
    assert active(lab, "lab2") == "active" and pid_of(lab, "lab2") == hung
    gone = status(lab, tp_pp)
    assert gone.returncode == 1 and "group g1 (lab1, lab2) does not serve: lab1 (rank 0)" in (
        gone.stderr), gone.stderr  # fmt: skip
    deploy(lab, tp_pp)
    assert pid_of(lab, "lab2") != hung
    check_serving(lab, tp_pp)

    # a deploy killed once every rank stopped, and one killed once every rank started (before
    # the gate, before the state is recorded): each next run converges
    for point in ("Start every rank of group g1", "Gate group g1 at rank 0"):
        on_host(lab, "lab2", f"systemctl kill --signal=SIGKILL {UNIT}")
        _, killed = run_killed(lab, *data(tp_pp), at=lambda _n, name, p=point: name.endswith(p))
        assert killed, point
        deploy(lab, tp_pp)
        check_serving(lab, tp_pp)
        assert deploy(lab, tp_pp) == [], point
        assert status(lab, tp_pp).returncode == 0, point

    # the same hosts to data parallel: every rank serves its own API, the group restarts as one
    dep = "multi_node_dep"
    deploy(lab, dep)
    check_serving(lab, dep)
    assert answers(lab, "lab2")
    assert deploy(lab, dep) == []
    assert status(lab, dep).returncode == 0
