"""Tear a lab down: find what is ours (host and server processes, mounts, namespaces, links,
cgroups) by pidfile and by scanning, and remove it all, so a crashed run never blocks the next
one."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.machine import check_can_run, restore_sysctls
from servefleet.fleet.lab.state import LabError

HOST_CGROUP = re.compile(
    rf"/{re.escape(layout.CGROUP_PREFIX + layout.HOST_PREFIX)}\d+(/|$)", re.MULTILINE
)
CGROUP_ROOTS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))


# --- finding what is ours -----------------------------------------------------------------------
def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _is_server(pid: int) -> bool:
    argv = _cmdline(pid)
    return any(
        argv[i] == "-m" and argv[i + 1] == layout.SERVER_MODULE for i in range(len(argv) - 1)
    )


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def host_pids() -> list[int]:
    """Every process in a lab host's cgroup (launchers, their inits and all inside)."""
    found = []
    for pid in _pids():
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if HOST_CGROUP.search(text):
            found.append(pid)
    return found


def server_pids() -> list[int]:
    """Every lab server process (by pidfile or by its command line)."""
    found = {pid for pid in _pids() if _is_server(pid)}
    for pidfile in layout.STATE_RUN.glob("*.pid") if layout.STATE_RUN.is_dir() else []:
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        if _is_server(pid):
            found.add(pid)
    return sorted(found)


def _launcher_pids() -> list[int]:
    found = []
    for pidfile in layout.STATE_HOSTS.glob("*/pid") if layout.STATE_HOSTS.is_dir() else []:
        try:
            found.append(int(pidfile.read_text().strip()))
        except (OSError, ValueError):
            continue
    return found


def our_mounts() -> list[str]:
    """Mount points under the state directory, deepest first."""
    prefix = str(layout.STATE_DIR) + "/"
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def our_netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [name for name in names if name.startswith(layout.NETNS_PREFIX)]


def our_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n == layout.BRIDGE or n.startswith(layout.VETH_PREFIX)]


def our_cgroups() -> list[Path]:
    """Host cgroups left in the name=systemd and unified hierarchies, deepest first."""
    found: list[Path] = []
    tag = layout.CGROUP_PREFIX + layout.HOST_PREFIX
    for root in CGROUP_ROOTS:
        if not root.is_dir():
            continue
        for dirpath, dirnames, _ in os.walk(root):
            for name in dirnames:
                if name.startswith(tag):
                    top = Path(dirpath) / name
                    found.extend(Path(d) for d, _, _ in os.walk(top, topdown=False))
            dirnames[:] = [d for d in dirnames if not d.startswith(tag)]
    return found


def _kill_all(pids_of: Any, deadline: float) -> list[int]:
    """SIGKILL what pids_of() returns until nothing is left or the deadline passes."""
    left: list[int] = pids_of()
    while left and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
        left = pids_of()
    return left


# --- clear / down -------------------------------------------------------------------------------
def clear() -> None:
    """Remove everything of an earlier lab (running or crashed): processes, mounts, namespaces,
    links, cgroups and the state directory. Raises LabError when something cannot be removed."""
    deadline = time.monotonic() + 20
    for pid in _launcher_pids():  # stop the boot loops first, so no host comes back
        if HOST_CGROUP.search(_read(f"/proc/{pid}/cgroup")):
            _signal(pid, signal.SIGKILL)
    left = _kill_all(lambda: sorted(set(host_pids()) | set(server_pids())), deadline)
    if left:
        raise LabError(f"lab processes do not die: {' '.join(map(str, left))}")
    for point in our_mounts():
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)
    for name in our_netns():
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    for link in our_links():
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    for cgroup in our_cgroups():
        try:
            cgroup.rmdir()
        except OSError:
            pass
    problems = []
    if our_mounts():
        problems.append("mounts " + " ".join(our_mounts()))
    if our_netns():
        problems.append("namespaces " + " ".join(our_netns()))
    if our_links():
        problems.append("links " + " ".join(our_links()))
    if our_cgroups():
        problems.append("cgroups " + " ".join(map(str, our_cgroups())))
    if problems:
        raise LabError("cannot clear the earlier lab: " + "; ".join(problems))
    restore_sysctls()  # the hosts that needed them are gone
    if layout.STATE_DIR.exists():
        shutil.rmtree(layout.STATE_DIR)


def down() -> None:
    """Stop and remove the whole lab (the caches stay)."""
    check_can_run()
    clear()


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
