"""`servefleet plan` and `servefleet status` against the lab fleet: built on the deploy's own
probe and planner, they change nothing, and status names what drifts or is unhealthy, and a
host whose sshd is stopped as unreachable (its Prometheus targets kept, labelled)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from faults import REPO, make_change_cold, resolved, run, secrets
from labhelpers import on_host, servefleet

from servefleet.base.version import VERSION

SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
HOSTS = ["lab1", "lab2", "lab3"]


def cli(state: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **secrets(state)}
    return subprocess.run([SERVEFLEET, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def converged_targets(state: dict[str, Any], prom: Path) -> list[dict[str, Any]]:
    """Deploy, then status (exit 0) with its Prometheus file: the file's target groups."""
    assert run(state).returncode == 0
    ok = cli(state, "status", "inventories/lab.py", "--prometheus", str(prom))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    return list(json.loads(prom.read_text()))


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
    from servefleet.settings.table import load_defaults

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
    prom = tmp_path / "targets.json"
    targets = converged_targets(lab, prom)
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
    # which servefleet converged each host (#32 item 6), read back from its good state
    assert {h: s["servefleet"] for h, s in json.loads(killed.stdout).items()} == dict.fromkeys(
        HOSTS, VERSION
    )
    assert run(lab, "--limit", "lab3").returncode == 0
    assert cli(lab, "status", "inventories/lab.py").returncode == 0


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll ``condition()`` until it holds; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} (after {timeout} s)"
        time.sleep(0.2)


def host_systemctl(state: dict[str, Any], host: str, *args: str) -> None:
    """systemctl inside a lab host, entered from the machine (not over SSH, which may be the
    thing stopped): the namespaces of its PID 1, found among its network namespace's processes."""
    netns = next(h["netns"] for h in state["hosts"] if h["name"] == host)
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                          check=True).stdout.split()  # fmt: skip
    init = None
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        nspid = next((x.split()[1:] for x in status.splitlines() if x.startswith("NSpid:")), [])
        if nspid[-1:] == ["1"]:
            init = pid
            break
    assert init, f"{host}: no PID 1 among the processes of {netns}"
    subprocess.run(["nsenter", "-t", init, "-m", "-u", "-i", "-n", "-p", "--", "systemctl",
                    *args], check=True, capture_output=True, timeout=60)  # fmt: skip


def answers_ssh(host: str) -> bool:
    return servefleet("lab", "ssh", host, "true", check=False, timeout=60).returncode == 0


def test_status_names_a_host_whose_sshd_is_stopped_and_keeps_its_targets(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    prom = tmp_path / "targets.json"
    before = {g["labels"]["host"]: g["targets"] for g in converged_targets(lab, prom)}
    assert len(before["lab2"]) == 4
    done = threading.Event()
    reads: list[bool] = []

    def poll() -> None:  # a reader of the file (Prometheus) while status rewrites it
        while not done.is_set():
            try:
                json.loads(prom.read_text())
                reads.append(True)
            except ValueError:
                reads.append(False)

    host_systemctl(lab, "lab2", "stop", "ssh.service")
    try:
        wait_for(lambda: not answers_ssh("lab2"), "lab2 still answers SSH")
        reader = threading.Thread(target=poll)
        reader.start()
        try:
            down = cli(lab, "status", "inventories/lab.py", "--prometheus", str(prom))
        finally:
            done.set()
            reader.join()
        limited = cli(lab, "status", "inventories/lab.py", "--limit", "lab2", "--json")
    finally:
        host_systemctl(lab, "lab2", "start", "ssh.service")
    assert down.returncode == 1, down.stdout + down.stderr
    assert "servefleet: lab2: unreachable: Could not connect" in down.stderr, down.stderr
    assert "lab1" not in down.stderr and "lab3" not in down.stderr
    rows = {line.split()[0]: line for line in down.stdout.splitlines()[1:]}
    assert sorted(rows) == HOSTS and "unreachable: Could not connect" in rows["lab2"]
    groups = {g["labels"]["host"]: g for g in json.loads(prom.read_text())}
    assert sorted(groups) == HOSTS
    assert groups["lab2"]["targets"] == before["lab2"]  # every instance it had, still scraped
    assert groups["lab2"]["labels"]["unreachable"] == "1"
    assert all("unreachable" not in groups[h]["labels"] for h in ("lab1", "lab3"))
    assert reads and all(reads), "a reader saw a partial Prometheus file"
    # --limit as an option: only lab2, named unreachable
    assert limited.returncode == 1
    assert list(json.loads(limited.stdout)) == ["lab2"]
    assert json.loads(limited.stdout)["lab2"]["unreachable"].startswith("Could not connect")
    wait_for(lambda: answers_ssh("lab2"), "lab2's sshd did not come back")
    back = cli(lab, "status", "inventories/lab.py", "--prometheus", str(prom))
    assert back.returncode == 0, back.stdout + back.stderr
    assert all("unreachable" not in g["labels"] for g in json.loads(prom.read_text()))
