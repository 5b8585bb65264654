"""A real Prometheus (Debian's, unpacked by setup.sh) on the lab: started by the test on a
loopback port with a directory of its own, it scrapes every instance through the file_sd targets
`servefleet status --prometheus` writes and servefleet's own metrics from `status --textfile` (a
file server on loopback standing in for node_exporter's textfile collector), with the shipped
rules as `servefleet monitoring` renders them from the lab's data (every ``for:`` 1 s, the
intervals 1 s). Every instance is ``up``; a stopped server fires ServefleetInstanceDown; a host
whose sshd is stopped keeps its targets (still up, labelled unreachable) and fires
ServefleetHostUnreachable; a host whose unit was edited by hand fires ServefleetHostDrift and
ServefleetInstanceNotServingRelease from the textfile metrics. Each is repaired (a deploy, sshd
started, status again) and its alert ends. Prometheus is always stopped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults import run
from labhelpers import on_host, wait_for
from prom_tools import Prometheus, http_server
from test_plan_status import answers_ssh, cli, host_systemctl

from servefleet.fleet.monitoring.kit import prometheus_config

HOSTS = ["lab1", "lab2", "lab3"]
FAST = json.dumps({"for_seconds": 1})  # every alert fires one evaluation after its condition


@pytest.fixture
def watched(lab: dict[str, Any], tmp_path: Path) -> Iterator[tuple[Prometheus, Path, Path]]:
    """The converged lab, its targets and textfile written, and a Prometheus watching it: the
    Prometheus, the targets file and the textfile."""
    deployed = run(lab)
    assert deployed.returncode == 0, deployed.stdout[-4000:] + deployed.stderr[-4000:]
    targets, textfile, rules = (tmp_path / n for n in ("servefleet.json", "servefleet.prom",
                                                       "servefleet-rules.yml"))  # fmt: skip
    rendered = cli(lab, "monitoring", "inventories/lab.py", "--out", str(rules), "--data",
                   f"monitoring_thresholds={FAST}")  # fmt: skip
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    assert "for: 1s" in rules.read_text()
    status(lab, targets, textfile, 0)

    def textfile_now(_path: str) -> tuple[int, bytes]:  # node_exporter's textfile collector's
        return 200, textfile.read_bytes() if textfile.exists() else b""

    with http_server(textfile_now, "text/plain; version=0.0.4") as port:
        config = prometheus_config(targets=str(targets), rules_file=str(rules), interval="1s",
                                   refresh="1s", textfile_targets=[f"127.0.0.1:{port}"])  # fmt: skip
        (tmp_path / "prometheus").mkdir()
        with Prometheus(tmp_path / "prometheus", config) as prom:
            yield prom, targets, textfile


def status(lab: dict[str, Any], targets: Path, textfile: Path, code: int) -> None:
    done = cli(lab, "status", "inventories/lab.py", "--prometheus", str(targets), "--textfile",
               str(textfile))  # fmt: skip
    assert done.returncode == code, done.stdout + done.stderr


def firing_hosts(prom: Prometheus, alert: str) -> set[str]:
    return {labels.get("host", "") for labels in prom.firing(alert)}


def values(prom: Prometheus, expr: str) -> list[float]:
    return [s["value"] for s in prom.query(expr)]


def address(lab: dict[str, Any], host: str) -> str:
    return str(next(h["address"] for h in lab["hosts"] if h["name"] == host))


def test_prometheus_scrapes_the_lab_and_fires_the_shipped_alerts(
    lab: dict[str, Any], watched: tuple[Prometheus, Path, Path]
) -> None:
    prom, targets, textfile = watched
    groups = json.loads(targets.read_text())
    instances = sum(len(g["targets"]) for g in groups if g["labels"]["job"] == "servefleet-vllm")
    assert instances == 4 * len(HOSTS)

    # every instance up, servefleet's own metrics scraped, no alert of the kit firing
    wait_for(lambda: values(prom, 'up{job="servefleet-vllm"}') == [1.0] * instances,
             "every instance up", timeout=60)  # fmt: skip
    wait_for(lambda: len(values(prom, "servefleet_host_reachable == 1")) == len(HOSTS),
             "the textfile metrics scraped", timeout=60)  # fmt: skip
    for alert in ("ServefleetInstanceDown", "ServefleetHostUnreachable", "ServefleetHostDrift"):
        assert firing_hosts(prom, alert) == set(), alert

    # a stopped server: its target is down and the instance-down alert fires for it alone
    on_host(lab, "lab3", "systemctl stop servefleet-vllm-1.service")
    down = f"{address(lab, 'lab3')}:8001"
    try:
        wait_for(lambda: any(a.get("instance") == down
                             for a in prom.firing("ServefleetInstanceDown")),
                 f"ServefleetInstanceDown for {down}")  # fmt: skip
        assert [a["instance"] for a in prom.firing("ServefleetInstanceDown")] == [down]
    finally:
        fixed = run(lab, "--limit", "lab3")
    assert fixed.returncode == 0, fixed.stdout[-4000:] + fixed.stderr[-4000:]
    wait_for(lambda: not prom.firing("ServefleetInstanceDown"), "ServefleetInstanceDown ends")

    # sshd stopped on lab2: status names it unreachable, its targets stay (and still serve)
    host_systemctl(lab, "lab2", "stop", "ssh.service")
    try:
        wait_for(lambda: not answers_ssh("lab2"), "lab2 still answers SSH")
        status(lab, targets, textfile, 1)
        kept = {g["labels"]["host"]: g for g in json.loads(targets.read_text())}
        assert kept["lab2"]["labels"].get("unreachable") == "1"
        assert len(kept["lab2"]["targets"]) == 4
        wait_for(lambda: firing_hosts(prom, "ServefleetHostUnreachable") == {"lab2"},
                 "ServefleetHostUnreachable for lab2")  # fmt: skip
        wait_for(lambda: values(prom, 'up{host="lab2", unreachable="1"}') == [1.0] * 4,
                 "lab2's four targets scraped, labelled unreachable")  # fmt: skip
        assert values(prom, 'servefleet_host_reachable{host="lab2"}') == [0.0]
        assert not prom.firing("ServefleetInstanceDown")  # its servers still serve
    finally:
        host_systemctl(lab, "lab2", "start", "ssh.service")
    wait_for(lambda: answers_ssh("lab2"), "lab2's sshd did not come back")
    status(lab, targets, textfile, 0)
    wait_for(lambda: not prom.firing("ServefleetHostUnreachable"), "ServefleetHostUnreachable ends")

    # a unit edited by hand on lab1: the textfile says drift, the drift alerts fire for lab1
    unit = "/etc/systemd/system/servefleet-vllm-2.service"
    on_host(
        lab, "lab1", f"sed -i 's/^RestartSec=5/RestartSec=6/' {unit} && systemctl daemon-reload"
    )
    try:
        status(lab, targets, textfile, 1)
        assert 'servefleet_host_drift{host="lab1"} 1\n' in textfile.read_text()
        wait_for(lambda: firing_hosts(prom, "ServefleetHostDrift") == {"lab1"},
                 "ServefleetHostDrift for lab1")  # fmt: skip
        wait_for(lambda: [(a["host"], a["unit"])
                          for a in prom.firing("ServefleetInstanceNotServingRelease")]
                 == [("lab1", "servefleet-vllm-2.service")],
                 "ServefleetInstanceNotServingRelease for lab1's servefleet-vllm-2")  # fmt: skip
    finally:
        fixed = run(lab, "--limit", "lab1")
    assert fixed.returncode == 0, fixed.stdout[-4000:] + fixed.stderr[-4000:]
    status(lab, targets, textfile, 0)
    wait_for(lambda: not prom.firing("ServefleetHostDrift"), "ServefleetHostDrift ends")
    wait_for(lambda: values(prom, 'up{job="servefleet-vllm"}') == [1.0] * instances,
             "every instance up again")  # fmt: skip
