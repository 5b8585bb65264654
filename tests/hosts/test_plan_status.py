"""`servefleet plan` and `servefleet status` against the lab fleet: built on the deploy's own
probe and planner, they change nothing, and status names what drifts or is unhealthy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from faults import REPO, make_change_cold, resolved, run, secrets
from labhelpers import on_host

SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
HOSTS = ["lab1", "lab2", "lab3"]


def cli(state: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **secrets(state)}
    return subprocess.run([SERVEFLEET, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def plans(state: dict[str, Any], *pyinfra_args: str) -> dict[str, Any]:
    proc = cli(state, "plan", "inventories/lab.py", "--json", "--", *pyinfra_args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_plan_on_a_converged_fleet_reports_no_change(lab: dict[str, Any]) -> None:
    assert run(lab).returncode == 0
    before = {h: on_host(lab, h, "ls -la --time-style=+%s /opt/servefleet/state").stdout
              for h in HOSTS}  # fmt: skip
    got = plans(lab)
    assert sorted(got) == HOSTS
    assert not [h for h, p in got.items() if p["changes"]], got
    table = cli(lab, "plan", "inventories/lab.py")
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:2] == ["host", "driver"]
    assert {h: on_host(lab, h, "ls -la --time-style=+%s /opt/servefleet/state").stdout
            for h in HOSTS} == before  # fmt: skip


def test_plan_shows_an_upgrade_and_a_recompile(lab: dict[str, Any]) -> None:
    from servefleet.settings import load_defaults

    # the default data converged, no other release or compile cache kept (earlier tests' are)
    assert run(lab).returncode == 0
    make_change_cold(lab, HOSTS)

    pins = [p.replace("==0.12.0", "==0.12.1") for p in load_defaults()["sdk_pins"]]
    upgrade = plans(lab, "--data", f"sdk_pins={json.dumps(pins)}")
    for host, p in upgrade.items():
        assert p["changes"] and p["install_release"], host
        assert p["packages"]["vllm-rbln"] == ["0.12.0", "0.12.1"]
        assert not p["recompile"], "a patch upgrade keeps the compile cache"
        assert len(p["restarts"]) == 4
    # a compile-affecting change whose fingerprint no host has warm (earlier tests may have it)
    fingerprint = resolved("--target", "throughput")["compile_fingerprint"]
    for host in HOSTS:
        on_host(lab, host, f"rm -f /var/cache/servefleet/vllm/servefleet-warm/{fingerprint}")
    recompile = plans(lab, "--data", "serve_target=Throughput")
    assert all(p["recompile"] and len(p["restarts"]) == 4 for p in recompile.values())


def test_status_names_a_hand_edited_unit_and_a_killed_server(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    assert run(lab).returncode == 0
    prom = tmp_path / "targets.json"
    ok = cli(lab, "status", "inventories/lab.py", "--prometheus", str(prom))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    targets = json.loads(prom.read_text())
    assert sorted(g["labels"]["host"] for g in targets) == HOSTS
    assert all(len(g["targets"]) == 4 for g in targets)
    unit = "/etc/systemd/system/servefleet-vllm-2.service"
    on_host(
        lab, "lab2", f"sed -i 's/^RestartSec=5/RestartSec=6/' {unit} && systemctl daemon-reload"
    )
    edited = cli(lab, "status", "inventories/lab.py")
    assert edited.returncode == 1
    assert "servefleet: lab2: servefleet-vllm-2.service drifts" in edited.stderr
    assert "lab1" not in edited.stderr and "lab3" not in edited.stderr
    assert run(lab, "--limit", "lab2").returncode == 0  # the deploy puts it back
    assert cli(lab, "status", "inventories/lab.py").returncode == 0
    on_host(
        lab,
        "lab3",
        "systemctl kill -s KILL --kill-whom=main servefleet-vllm-1.service; "
        "systemctl stop servefleet-vllm-1.service",
    )
    killed = cli(lab, "status", "inventories/lab.py", "--json")
    assert killed.returncode == 1
    assert "servefleet: lab3: servefleet-vllm-1.service (port 8001) unhealthy" in killed.stderr
    inst = json.loads(killed.stdout)["lab3"]["instances"][1]
    assert inst["active"] != "active" and inst["drift"]
    assert run(lab, "--limit", "lab3").returncode == 0
    assert cli(lab, "status", "inventories/lab.py").returncode == 0
