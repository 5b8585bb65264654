"""The prefill/decode re-check after a restart (#21, ``remote/restart_gate.py``): each decode of the
host takes one request from each prefill as the router sends it; a decode that fails restarts
through its gate and must then pass; prefills and whole-request servers are never touched. The
request (``health.pd_probe``) and the gate are the test's; test_sim_pd.py runs pd_probe against
simulated servers."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import health  # noqa: E402
import restart_gate  # noqa: E402
import systemd_units  # noqa: E402

PREFILLS = ["http://10.0.0.1:8000", "http://10.0.0.1:8001"]


def state(*roles: str) -> dict[str, Any]:
    return {
        "model": "m",
        "health_timeout": 5,
        "instances": [
            {"unit": f"servefleet-vllm-{i}.service", "role": r, "worker": f"http://h:{8000 + i}"}
            for i, r in enumerate(roles)
        ],
    }


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``broken``: the decode URLs that fail until restarted (``stuck``: also after);
    ``events``: each probe and restart, in order."""
    w: dict[str, Any] = {"broken": set(), "stuck": set(), "events": []}

    def pd_probe(prefill: str, decode: str, model: str, limit: float, key: Any = None) -> Any:
        w["events"].append(f"probe {prefill} {decode}")
        return "answered 500" if decode in w["broken"] else None

    def start_through_gate(st: dict[str, Any], inst: dict[str, Any], restart: bool) -> None:
        w["events"].append(f"restart {inst['unit']}")
        if inst["worker"] not in w["stuck"]:
            w["broken"].discard(inst["worker"])

    monkeypatch.setattr(health, "pd_probe", pd_probe)
    monkeypatch.setattr(health, "unit_state", lambda unit: None)
    monkeypatch.setattr(health, "api_key", lambda st: None)
    monkeypatch.setattr(restart_gate, "start_through_gate", start_through_gate)
    return w


def test_each_decode_takes_a_request_from_each_prefill(world: dict[str, Any]) -> None:
    restart_gate.recheck_peers(state("prefill", "decode", "main", "decode"), PREFILLS)
    assert world["events"] == [
        f"probe {p} http://h:{port}" for port in (8001, 8003) for p in PREFILLS
    ]


def test_a_decode_that_fails_restarts_and_passes(world: dict[str, Any]) -> None:
    world["broken"].add("http://h:8003")
    restart_gate.recheck_peers(state("prefill", "decode", "prefill", "decode"), PREFILLS)
    assert world["events"] == [
        *(f"probe {p} http://h:8001" for p in PREFILLS),
        f"probe {PREFILLS[0]} http://h:8003",  # the first failure is enough
        "restart servefleet-vllm-3.service",
        *(f"probe {p} http://h:8003" for p in PREFILLS),
    ]


def test_a_decode_that_fails_after_its_restart_fails_the_check(world: dict[str, Any]) -> None:
    world["broken"].add("http://h:8001")
    world["stuck"].add("http://h:8001")
    with pytest.raises(systemd_units.Failed, match=r"servefleet-vllm-1\.service: prefill/decode "
                       "re-check: answered 500"):  # fmt: skip
        restart_gate.recheck_peers(state("prefill", "decode"), PREFILLS)
    assert world["events"].count("restart servefleet-vllm-1.service") == 1


def test_no_prefill_or_no_decode_checks_nothing(world: dict[str, Any]) -> None:
    restart_gate.recheck_peers(state("decode", "decode"), [])
    restart_gate.recheck_peers(state("prefill", "main"), PREFILLS)
    assert world["events"] == []


def test_a_process_serves_on_its_last_port_flag() -> None:
    """A card's own ``--port`` comes before the one the deploy adds; argparse takes the last,
    and so must the converge that makes room for an instance (it stopped the prefill whose card
    said 8001 to make room for a decode on 8001)."""
    code = "import time; print('up', flush=True); time.sleep(30)"
    argv = [sys.executable, "-c", code, "--port", "8001", "--port=8000"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:  # its line says it runs: until its exec, /proc/PID/cmdline is pytest's own
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        assert systemd_units.process_port(proc.pid) == 8000
    finally:
        proc.kill()
        proc.communicate()
    assert systemd_units.process_port(proc.pid) is None  # gone
