"""``lab down`` leaves nothing behind; ``lab up`` after a crash still works; a non-root user gets
one clear line. These take the session lab down, so they run last and leave a fresh lab behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from labhelpers import LAB_HOSTS, lab_up, on_host, servefleet

from servefleet.fleet.lab import layout, teardown
from servefleet.fleet.lab.state import load_state

pytestmark = pytest.mark.lab_destructive


def _leftovers() -> dict[str, Any]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    mounts = Path("/proc/mounts").read_text()
    return {
        "netns": [line for line in netns.splitlines() if line.startswith(layout.NETNS_PREFIX)],
        "mounts": [line for line in mounts.splitlines() if str(layout.STATE_DIR) in line],
        "overlays": [
            line for line in mounts.splitlines() if " overlay " in line and "sf-ovl-" in line
        ],
        "links": [n for n in (layout.BRIDGE, layout.VETH_PREFIX) if f" {n}" in links],
        "host processes": teardown.host_pids(),
        "server processes": teardown.server_pids(),
        "cgroups": teardown.our_cgroups(),
        "state": layout.STATE_FILE.exists(),
    }


NOTHING = {
    "netns": [],
    "mounts": [],
    "overlays": [],
    "links": [],
    "host processes": [],
    "server processes": [],
    "cgroups": [],
    "state": False,
}


def test_down_leaves_no_namespace_mount_or_process(lab: dict[str, Any], repo_root: Path) -> None:
    before = _leftovers()
    assert (
        len(before["netns"]) == LAB_HOSTS
        and before["host processes"]
        and before["server processes"]
    )
    servefleet("lab", "down")
    assert _leftovers() == NOTHING
    # with the lab down, its users get one clear line, no traceback
    env = servefleet("lab", "env", check=False)
    assert (
        env.returncode == 2 and "the lab is not up" in env.stderr and "Traceback" not in env.stderr
    )
    pyinfra = Path(sys.executable).parent / "pyinfra"
    inv = subprocess.run(
        [str(pyinfra), "-y", "inventories/lab.py", "exec", "--", "true"],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    assert inv.returncode != 0
    assert "the lab is not up" in inv.stderr and "Traceback" not in inv.stderr, inv.stderr
    servefleet("lab", "down")  # idempotent


def test_up_after_a_crash_clears_the_leftovers(lab: dict[str, Any]) -> None:
    state = lab_up("--odd-sku", "lab3=RBLN-CA25", "--devices", "2", "--compile-seconds", "0.5")
    old_hosts, old_servers = teardown.host_pids(), teardown.server_pids()
    # a crash: the servers die, the host launchers die (their systemd keeps running, overlays
    # stay mounted), pidfiles and state vanish
    for pid in old_servers:
        os.kill(pid, signal.SIGKILL)
    for host in state["hosts"]:
        os.kill(int(Path(layout.STATE_HOSTS / host["name"] / "pid").read_text()), signal.SIGKILL)
    for pidfile in [*layout.STATE_RUN.glob("*.pid"), *layout.STATE_HOSTS.glob("*/pid")]:
        pidfile.unlink()
    layout.STATE_FILE.unlink()
    time.sleep(0.2)
    assert len(_leftovers()["overlays"]) == LAB_HOSTS
    state = lab_up("--odd-sku", "lab3=RBLN-CA25", "--devices", "2", "--compile-seconds", "0.5")
    assert not set(old_hosts) & set(teardown.host_pids())
    assert [h["sku"] for h in state["hosts"]] == ["RBLN-CR13", "RBLN-CR13", "RBLN-CA25"]
    assert "1eff:1250" in on_host(state, "lab3", "lspci -n").stdout
    assert on_host(state, "lab1", "lspci -n | grep -c 1eff:2130").stdout.strip() == "2"
    assert on_host(state, "lab2", "cat /etc/rbln-sim/compile-seconds").stdout.strip() == "0.5"
    for host in state["hosts"]:
        assert (
            on_host(state, host["name"], "systemctl is-system-running").stdout.strip() == "running"
        )
    # leave the default lab for whoever comes next
    lab.clear()
    lab.update(lab_up())


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_not_root_is_one_clear_line(lab: dict[str, Any]) -> None:
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "servefleet",
            "lab",
            "up",
        ],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"]},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "servefleet lab: the lab fleet needs root (network namespaces, overlay mounts); run as root"
    )
    assert load_state() == lab  # the running lab is untouched
