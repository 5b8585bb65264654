"""Two serving groups on four H200 hosts (#34): DeepSeek-V3.2's ``multi_node_tp_pp`` as g1
(lab1, lab2) and g2 (lab3, lab4), from an inventory that gives each host its ``serve_group``.
A group of 3 for the 2-node strategy, and a group whose hosts name different hardware, are each
refused in one line before any change. A rollout with ``--canary 1`` takes one group first;
when the canary group fails its gate on the change (a fault switch holding the change's text on
its rank 0) it rolls back as one and g2 is untouched; without the fault the same rollout runs
both groups, a batch each, and every rank ends on the change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faults import REPO, secrets
from labhelpers import on_host, relabbed
from test_multinode import MODEL, RECIPE, UNIT, address, process

from servefleet.fleet.lab.chat import chat_once

SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
HOSTS = ("lab1", "lab2", "lab3", "lab4")
GROUPS = {"lab1": "g1", "lab2": "g1", "lab3": "g2", "lab4": "g2"}
CHANGE = ["--data", 'serve_extra_args=["--max-num-seqs", "64"]']
FAULT = "/etc/rbln-sim/fail-health"


@pytest.fixture
def four_h200(lab: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Four H200 hosts; the session lab comes back as it was after."""
    with relabbed(lab, "--hosts", "4", "--hardware", "h200") as four:
        yield four


def inventory(path: Path, groups: dict[str, str], **data: Any) -> str:
    """The lab as an inventory whose hosts carry ``serve_group`` (``groups``) and ``data``."""
    host_data = {"serve_recipe": RECIPE, "serve_strategy": "multi_node_tp_pp",
                 "serve_hardware": "h200", **data}  # fmt: skip
    path.write_text(f"""
from servefleet.fleet.lab.state import load_state
_s = load_state()
_ssh = dict(ssh_user=_s["ssh"]["user"], ssh_key=_s["ssh"]["key"],
            ssh_known_hosts_file=_s["ssh"]["known_hosts"], ssh_strict_host_key_checking="yes")
_groups = {groups!r}
_data = {host_data!r}
lab = [(h["name"], dict(_ssh, ssh_hostname=h["address"], serve_group=_groups.get(h["name"]),
        **_data)) for h in _s["hosts"]]
h200 = [h["name"] for h in _s["hosts"]]
""")
    return str(path)


def cli(lab: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **secrets(lab), "PYINFRA_PROGRESS": "off"}
    return subprocess.run([SERVEFLEET, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1800)  # fmt: skip


def snapshot(lab: dict[str, Any], host: str) -> str:
    """What a host runs: its unit files, its server's pid, its current release."""
    return on_host(lab, host, "cat /etc/systemd/system/servefleet-vllm-*.service 2>/dev/null; "
                   f"systemctl show -p MainPID {UNIT}; readlink /opt/servefleet/current || true"
                   ).stdout  # fmt: skip


def changed(lab: dict[str, Any], host: str) -> bool:
    return "--max-num-seqs" in process(lab, host)[1]


def answers(lab: dict[str, Any], host: str) -> bool:
    try:
        return bool(chat_once(address(lab, host), 8000, MODEL, "hi", max_tokens=1))
    except OSError:
        return False


def test_a_rollout_over_two_groups(four_h200: dict[str, Any], tmp_path: Path) -> None:
    lab = four_h200
    inv = inventory(tmp_path / "groups.py", GROUPS)
    first = cli(lab, "rollout", inv, "--yes", "--batch-size", "1")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert "batch 1/2: lab1, lab2\n" in first.stdout and "batch 2/2: lab3, lab4\n" in first.stdout
    assert answers(lab, "lab1") and answers(lab, "lab3")
    before = {h: snapshot(lab, h) for h in HOSTS}

    # bad placement, refused in one line before any change on any host
    three = inventory(tmp_path / "three.py", {"lab1": "g1", "lab2": "g1", "lab3": "g1"})
    mixed = tmp_path / "mixed.py"
    inventory(mixed, GROUPS)
    mixed.write_text(mixed.read_text() + '\nlab[1][1]["serve_hardware"] = "h100"\n')
    for bad, limit, why, others in (
        (three, "lab[123]", "serve_group 'g1': 3 hosts (lab1, lab2, lab3)", ()),
        (str(mixed), "lab*", "serve_group 'g1': serve_hardware on lab2 is 'h100', on lab1 'h200'",
         ("lab3", "lab4")),  # the run stopped before any change: not run, with g1's line
    ):  # fmt: skip
        refused = cli(lab, "rollout", bad, "--yes", "--limit", limit, "--json")
        assert refused.returncode == 1, refused.stdout[-3000:] + refused.stderr[-3000:]
        for host, result in json.loads(refused.stdout).items():  # each host: the one line
            assert result["result"] == "failed" and why in result["why"], (host, result["why"])
            assert result["why"].startswith("not run: ") == (host in others), host
            assert "\n" not in result["why"] and not result["rolled_back"]
        assert "Traceback" not in refused.stderr
        assert {h: snapshot(lab, h) for h in HOSTS} == before, bad

    # the canary group fails its gate on the change: it rolls back as one, g2 is untouched
    on_host(lab, "lab1", f"echo '--max-num-seqs 64 ' > {FAULT}")
    try:
        failed = cli(lab, "rollout", inv, "--yes", "--canary", "1", "--batch-size", "1",
                     "--json", "--", *CHANGE, "--data", "serve_health_timeout=8")  # fmt: skip
    finally:
        on_host(lab, "lab1", f"rm -f {FAULT}")
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    result = json.loads(failed.stdout)
    for host in ("lab1", "lab2"):
        assert result[host]["result"] == "failed" and result[host]["rolled_back"], result[host]
        assert not changed(lab, host)
    assert result["lab3"]["result"] == result["lab4"]["result"] == "not reached"
    assert {h: snapshot(lab, h) for h in ("lab3", "lab4")} == {
        h: before[h] for h in ("lab3", "lab4")
    }
    assert answers(lab, "lab1")  # back on its last good state, serving

    # without the fault: one group a batch, the canary first; every rank ends on the change
    done = cli(lab, "rollout", inv, "--yes", "--canary", "1", "--batch-size", "1", "--", *CHANGE)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "batch 1/2: lab1, lab2\n" in done.stdout and "batch 2/2: lab3, lab4\n" in done.stdout
    assert all(changed(lab, h) for h in HOSTS)
    assert answers(lab, "lab1") and answers(lab, "lab3")
