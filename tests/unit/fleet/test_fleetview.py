"""plan and status summaries from a HostPlan (pure): what would change, what drifts; hosts a run
could not reach (pyinfra's recorded output), and the Prometheus file replaced whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_pyinfra import whole_reads
from host_inputs import converged_probe, probe, probed_units, settings

from servefleet.fleet.fleetview import plan_summary, plan_table
from servefleet.fleet.statusview import (
    prometheus_targets,
    status_problems,
    status_summary,
    status_table,
)
from servefleet.hostplan.plan import plan_host


def test_fresh_host_plans_everything() -> None:
    p = plan_summary(plan_host(settings(), probe()))
    assert p["changes"] and p["recompile"] and p["install_release"]
    assert p["driver"] == [None, "3.5.1"] and len(p["restarts"]) == 4
    assert "openai/gpt-oss-120b" in p["models"]


def test_converged_host_plans_nothing_and_status_is_clean() -> None:
    plan = plan_host(settings(), converged_probe())
    p = plan_summary(plan)
    assert not p["changes"] and not p["recompile"] and p["restarts"] == [] and p["packages"] == {}
    st = status_summary(plan, {str(8000 + i): "ok" for i in range(4)}, "10.0.0.5")
    assert status_problems("h1", st) == []
    assert prometheus_targets({"h1": st}) == [
        {
            "targets": [f"10.0.0.5:{8000 + i}" for i in range(4)],
            "labels": {"host": "h1", "release": st["release"], "job": "servefleet-vllm"},
        }
    ]
    assert "h1" in status_table({"h1": st}) and "h1" in plan_table({"h1": p})


def test_upgrade_shows_package_versions() -> None:
    from servefleet.settings.table import load_defaults

    pins = [x.replace("==0.12.0", "==0.12.1") for x in load_defaults()["sdk_pins"]]
    p = plan_summary(plan_host(settings(sdk_pins=pins), converged_probe()))
    assert p["packages"]["rebel-compiler"] == ["0.12.0", "0.12.1"]
    assert p["release"] and p["install_release"] and len(p["restarts"]) == 4
    assert not p["recompile"]


def test_status_names_drift_and_unhealthy_instances() -> None:
    plan = plan_host(settings(), converged_probe())
    first = plan.instances[2]
    units = probed_units(plan, {2: "0" * 16})
    drifted = plan_host(settings(), converged_probe(units=units))
    health = {"8000": "ok", "8001": "not answering: refused", "8002": "ok", "8003": "ok"}
    lines = status_problems("h2", status_summary(drifted, health, "h2"))
    assert lines == [
        "h2: servefleet-vllm-1.service (port 8001) unhealthy: not answering: refused",
        f"h2: {first.unit} drifts: runs {'0' * 16}, wants {first.sha}",
    ]


# ---------------------------------------------------------------------------------------------
# a host status cannot reach: named with pyinfra's reason, its instances kept for Prometheus

# what pyinfra 3 printed for two hosts it could not connect to (recorded; the first host's name
# is a prefix of the others', and pyinfra's colours are on)
RECORDED = (
    "--> Loading config...\n"
    "--> Loading inventory...\n"
    "--> Connecting to hosts...\n"
    "    Failed to load host keys from /root/.ssh/known_hosts: [Errno 2] No such file\n"
    "    [\x1b[1mlab1\x1b[0m]      \x1b[32mConnected\x1b[0m\n"
    "    [\x1b[1mlab10\x1b[0m]     \x1b[31mCould not connect ([Errno None] Unable to connect to "
    "port 22 on 10.0.0.10)\x1b[0m\n"
    "    [lab2.example.internal] Could not resolve hostname ([Errno -2] Name or service not "
    "known)\n"
    "    [lab3]      Authentication error (username=root, key=/k/id) (Authentication failed.)\n"
    "    [lab4]      SSH host key error (Host key for 10.0.0.4 does not match.)\n"
    "\n"
    "--> Preparing operations...\n"
    "    [lab1] servefleet: connection lost during 'Probe the host' (retry)\n"
    "    [lab5] servefleet: lab5: serve_target: 'Fast' is not one of Latency, Throughput\n"
    "--> Disconnecting from hosts...\n"
)
HOSTS = ["lab1", "lab10", "lab2.example.internal", "lab3", "lab4", "lab5", "lab6"]


def test_pyinfra_connection_errors_are_read_per_host() -> None:
    from servefleet.fleet.fleetview import connection_errors

    assert connection_errors(RECORDED, HOSTS) == {
        "lab10": "Could not connect ([Errno None] Unable to connect to port 22 on 10.0.0.10)",
        "lab2.example.internal": "Could not resolve hostname ([Errno -2] Name or service not "
        "known)",
        "lab3": "Authentication error (username=root, key=/k/id) (Authentication failed.)",
        "lab4": "SSH host key error (Host key for 10.0.0.4 does not match.)",
    }
    # a connector's reason outside the connecting stage (no stage lines: -q, another version)
    bare = "[lab6] Could not connect ([Errno 111] Connection refused)\n[lab1] Connected\n"
    assert connection_errors(bare, HOSTS) == {
        "lab6": "Could not connect ([Errno 111] Connection refused)"
    }


def test_hosts_without_a_summary_are_unreachable_or_failed_with_why() -> None:
    from servefleet.fleet.fleetview import missing_hosts

    found = {"lab4": {}}  # lab4 wrote one (a later connection worked): not missing
    assert missing_hosts(HOSTS, found, RECORDED) == {
        "lab1": {"unreachable": "connection lost during 'Probe the host' (retry)"},
        "lab10": {"unreachable": "Could not connect ([Errno None] Unable to connect to port 22 "
                  "on 10.0.0.10)"},
        "lab2.example.internal": {"unreachable": "Could not resolve hostname ([Errno -2] Name or "
                                  "service not known)"},
        "lab3": {"unreachable": "Authentication error (username=root, key=/k/id) "
                 "(Authentication failed.)"},
        "lab5": {"failed": "lab5: serve_target: 'Fast' is not one of Latency, Throughput"},
        "lab6": {"failed": "failed"},
    }  # fmt: skip


def test_pyinfra_refusing_to_start_is_its_own_line() -> None:
    from servefleet.fleet.fleetview import pyinfra_refusal

    refused = "Usage: pyinfra [OPTIONS] INVENTORY OPERATIONS...\nError: No such option: --bogus\n"
    assert pyinfra_refusal(refused, 2) == "Error: No such option: --bogus"
    no_deploy = "--> Loading config...\n--> pyinfra error: No deploy file: deploys/report.py\n"
    assert pyinfra_refusal(no_deploy, 1) == "--> pyinfra error: No deploy file: deploys/report.py"
    assert pyinfra_refusal("", 1) == "pyinfra exited 1 before it connected to any host"
    assert pyinfra_refusal(RECORDED, 1) is None  # it connected: each host says why


def test_an_unreachable_host_keeps_its_instances_with_the_unreachable_label() -> None:
    from servefleet.fleet.statusview import missing_status, planned_instances

    plan = plan_host(settings(), converged_probe())
    ok = status_summary(plan, {str(8000 + i): "ok" for i in range(4)}, "10.0.0.5")
    # last seen with 4 instances: those stay; never seen: serve_instances, else one
    seen = planned_instances(settings(), [8000, 8001, 8002, 8003])
    assert seen == [(f"servefleet-vllm-{i}.service", 8000 + i) for i in range(4)]
    assert planned_instances(settings(serve_base_port=9000)) == [
        ("servefleet-vllm-0.service", 9000)
    ]
    assert [p for _, p in planned_instances(settings(serve_instances=2))] == [8000, 8001]
    gone = missing_status({"unreachable": "Could not connect (refused)"}, "10.0.0.6", seen)
    failed = missing_status({"failed": "lab3: probe: odd output"}, "lab3", [(None, 8000)])
    statuses = {"h1": ok, "h2": gone, "h3": failed}
    assert set(gone) >= set(ok)  # every key a status has, so readers need no special case
    groups = prometheus_targets(statuses)
    assert [g["labels"].get("unreachable") for g in groups] == [None, "1", None]
    assert groups[1] == {
        "targets": [f"10.0.0.6:{8000 + i}" for i in range(4)],
        "labels": {"host": "h2", "job": "servefleet-vllm", "unreachable": "1"},  # no release
    }
    assert status_problems("h2", gone) == ["h2: unreachable: Could not connect (refused)"]
    assert status_problems("h3", failed) == ["h3: failed: lab3: probe: odd output"]
    rows = status_table(statuses).splitlines()
    assert rows[2].split()[:3] == ["h2", "unreachable:", "Could"]
    assert "8003:unreachable" in rows[2] and rows[3].split()[:3] == ["h3", "failed:", "lab3:"]
    assert plan_table({"h2": {"unreachable": "Could not connect"}}).splitlines()[1].split()[:2] == [
        "h2",
        "unreachable:",
    ]


def test_the_ports_last_seen_come_from_the_previous_file(tmp_path: Path) -> None:
    from servefleet.base.files import write_atomic
    from servefleet.fleet.fleetview import dumps
    from servefleet.fleet.statusview import missing_status, seen_ports

    path = tmp_path / "targets.json"
    assert seen_ports(path) == {}
    statuses = {
        "h1": missing_status({"unreachable": "x"}, "a1", [(None, 8000), (None, 8001)]),
        "h2": missing_status({"unreachable": "x"}, "a2", []),
    }
    write_atomic(path, dumps(prometheus_targets(statuses)))
    assert seen_ports(path) == {"h1": [8000, 8001]}
    for garbage in ("{", '{"a": 1}', '[{"targets": ["x"], "labels": {"host": "h"}}]', "[1]"):
        path.write_text(garbage)
        assert seen_ports(path) == {}, garbage


def test_the_prometheus_file_is_replaced_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the new file is written (at its fsync), the old one is still there whole and the new
    one sits in the same directory; then it is renamed over it, mode kept, nothing left behind.
    A plain write_text would leave the file truncated at that moment: this test would fail."""
    import os

    from servefleet.base.files import write_atomic

    path = tmp_path / "targets.json"
    old = json.dumps([{"targets": ["a:1"], "labels": {}}])
    path.write_text(old)
    path.chmod(0o640)
    new = json.dumps([{"targets": [f"h{i}:8000" for i in range(20000)], "labels": {}}])
    during: list[tuple[str, list[str]]] = []
    fsync = os.fsync

    def watch(fd: int) -> None:
        during.append((path.read_text(), sorted(p.name for p in tmp_path.iterdir())))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", watch)
    write_atomic(path, new)
    assert during[0][0] == old and len(during[0][1]) == 2  # the old file and the temporary one
    assert path.read_text() == new
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["targets.json"]
    write_atomic(tmp_path / "fresh.json", "[]")
    assert (tmp_path / "fresh.json").stat().st_mode & 0o777 == 0o644


def test_a_reader_polling_the_file_never_sees_a_partial_one(tmp_path: Path) -> None:
    """(A plain write_text here gives the reader thousands of partial files.)"""
    from servefleet.base.files import write_atomic

    path = tmp_path / "targets.json"
    versions = [
        json.dumps([{"targets": [f"h{n}-{i}:8000" for i in range(5000 + n)], "labels": {}}])
        for n in range(30)
    ]
    write_atomic(path, versions[0])

    def rewrite() -> None:
        for text in versions[1:] * 3:
            write_atomic(path, text)

    reads = whole_reads(path, rewrite)
    assert reads and all(reads)
