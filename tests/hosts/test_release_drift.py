"""Drift inside a release, seen and repaired (#36), on lab1 after a converged deploy: vLLM's
``METADATA`` edited to another version (as a ``pip install -U`` by hand leaves it), then a
module file removed (as a disk fault or a cleanup script might). Each time ``status`` exits 1
naming the release, the distribution and what differs, ``plan`` shows the reinstall, and the
next deploy installs the locked release again beside the drifted one (kept as
``<id>.tampered-...``), restarts every server onto it through the gate, and the run after
changes nothing. A deploy killed inside the reinstall converges on the next run. The serve user
cannot write into a release."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from faults import REPO, changed_ops, run, run_killed, secrets
from labhelpers import on_host
from test_plan_status import cli

from servefleet.fleet.lab.chat import chat_once

LIMIT = ("--limit", "lab1")
SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
SITE = "/opt/servefleet/current/lib/python3*/site-packages"
PORTS = range(8000, 8004)


def release(lab: dict[str, Any]) -> str:
    return on_host(lab, "lab1", "basename $(readlink /opt/servefleet/current)").stdout.strip()


def started(lab: dict[str, Any]) -> dict[str, str]:
    """Each server unit's main pid (they change when the servers restart)."""
    out = on_host(lab, "lab1", "for u in /etc/systemd/system/servefleet-vllm-*.service; do "
                  "systemctl show -p MainPID --value $(basename $u); done").stdout  # fmt: skip
    return dict(enumerate(out.split()))  # type: ignore[arg-type]


def serving(lab: dict[str, Any]) -> bool:
    address = next(h["address"] for h in lab["hosts"] if h["name"] == "lab1")
    return all(chat_once(address, p, "openai/gpt-oss-120b", "hi", max_tokens=1) for p in PORTS)


def drifted_then_repaired(lab: dict[str, Any], tamper: str, named: str) -> None:
    """Tamper with the serving release; status and plan name it; a deploy repairs it."""
    rel, pids = release(lab), started(lab)
    on_host(lab, "lab1", tamper)
    metrics = Path(tempfile.gettempdir()) / f"servefleet-test-{os.getpid()}.prom"
    status = cli(lab, "status", "inventories/lab.py", *LIMIT, "--textfile", str(metrics))
    assert status.returncode == 1
    assert f"servefleet: lab1: release {rel}: {named}" in status.stderr, status.stderr
    text = metrics.read_text()  # drift as a metric, for node_exporter's textfile collector
    assert (
        'servefleet_host_drift{host="lab1"} 1\n' in text
        and 'servefleet_host_reachable{host="lab1"} 1' in text
    )
    metrics.unlink()
    plan = cli(lab, "plan", "inventories/lab.py", *LIMIT)
    assert "reinstall (drifted)" in plan.stdout and named in plan.stderr, plan.stdout + plan.stderr
    fixed = run(lab, *LIMIT)
    assert fixed.returncode == 0, fixed.stdout[-4000:] + fixed.stderr[-4000:]
    assert f"release {rel} drifted" in fixed.stdout + fixed.stderr
    assert release(lab) == rel  # the same locked release, installed again
    aside = on_host(lab, "lab1", f"ls -d /opt/servefleet/releases/{rel}.tampered-*").stdout
    assert aside.strip(), "the drifted release is kept for inspection"
    now = started(lab)
    assert all(now[i] != pids[i] for i in pids), (pids, now)  # every server restarted onto it
    assert serving(lab)
    assert cli(lab, "status", "inventories/lab.py", *LIMIT).returncode == 0
    assert changed_ops(run(lab, "--json", *LIMIT)) == []


def test_a_drifted_release_is_seen_and_installed_again(lab: dict[str, Any]) -> None:
    first = run(lab, *LIMIT)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    marker = json.loads(
        on_host(lab, "lab1", "cat /opt/servefleet/current/.servefleet-release.json").stdout
    )
    version = marker["dists"]["vllm"]["version"]
    assert cli(lab, "status", "inventories/lab.py", *LIMIT).returncode == 0  # a fresh install
    # status and lock --check hold no index credentials (#35): monitoring and CI need none
    bare = {
        k: v for k, v in {**os.environ, **secrets(lab)}.items() if not k.startswith("RBLN_INDEX")
    }
    for args in (["status", "inventories/lab.py", *LIMIT], ["lock", "inventories/lab.py", "--check",
                 "--lock-dir", str(REPO / "locks" / "lab")]):  # fmt: skip
        done = subprocess.run([SERVEFLEET, *args], cwd=REPO, env=bare, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, (args, done.stdout + done.stderr)

    # the serve user cannot write into the release (root's, 0755)
    denied = on_host(lab, "lab1", f"site=$(echo {SITE}); runuser -u servefleet -- touch $site/vllm/x",
                     check=False)  # fmt: skip
    writable = on_host(lab, "lab1", "find /opt/servefleet/releases/ -perm -0002 ! -type l").stdout
    assert writable == "", writable  # nothing in a release another user may write
    assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied

    drifted_then_repaired(
        lab,
        f"sed -i 's/^Version: .*/Version: 9.9.9/' {SITE}/vllm-*.dist-info/METADATA",
        f"vllm: version 9.9.9, installed {version}",
    )
    drifted_then_repaired(
        lab,
        f"rm {SITE}/vllm/serve_args.py",
        "vllm: lib/python3.11/site-packages/vllm/serve_args.py is missing",
    )

    # the controller killed inside the reinstall: the next run converges
    on_host(lab, "lab1", f"rm {SITE}/vllm/serve_args.py")
    _, killed = run_killed(lab, *LIMIT, at=lambda _n, name: "Install release" in name,
                           then=lambda: on_host(lab, "lab1", "ls -d /opt/servefleet/releases/"
                                                "*.tampered-* | wc -l").stdout.strip() == "3")  # fmt: skip
    assert killed
    again = run(lab, *LIMIT)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert serving(lab) and cli(lab, "status", "inventories/lab.py", *LIMIT).returncode == 0
    assert changed_ops(run(lab, "--json", *LIMIT)) == []
