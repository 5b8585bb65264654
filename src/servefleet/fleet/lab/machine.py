"""The machine the lab fleet runs on: what it must have (root, the tools, namespaces), the one
command runner of the fleet's modules, and the machine limits ``lab up`` raises for its hosts
and ``lab down`` puts back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.state import LabError

TOOLS = (
    "ip",
    "unshare",
    "nsenter",
    "mount",
    "umount",
    "mmdebstrap",
    "zstd",
    "tar",
    "ssh",
    "ssh-keygen",
    "gpg",
    "gpgconf",
    "dpkg-deb",
    "dpkg-scanpackages",
    "apt-ftparchive",
)


def check_can_run() -> None:
    """Raise LabError (one line) unless this process can run the lab: root, tools, namespaces."""
    if os.geteuid() != 0:
        raise LabError("the lab fleet needs root (network namespaces, overlay mounts); run as root")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise LabError(
            f"the lab fleet needs {', '.join(missing)} (apt-get install mmdebstrap zstd "
            "openssh-client dpkg-dev apt-utils gnupg iproute2 util-linux)"
        )
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount", "--net", "--time", "true"], capture_output=True
    )
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["unknown error"]
        raise LabError(f"namespaces are unavailable here ({why[0]}); the lab fleet needs them")


def run(cmd: list[str], what: str, **kwargs: Any) -> str:
    """Run cmd and return its output; raise LabError (one line: what, then the command's last
    line) when it fails.

    + cmd: the argv
    + what: what the command does, for the error
    + kwargs: more ``subprocess.run`` arguments
    """
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LabError(f"{what} failed: {tail[0]}")
    return proc.stdout


# Each host's systemd (PID 1, journald, logind, the .path units) holds inotify instances, all
# counted against root's fs.inotify.max_user_instances (128 on Debian): past about 20 hosts,
# systemd's path units fail and sshd never starts. ``lab up`` raises the limit for its hosts and
# keeps the machine's value, which teardown's ``clear()`` (so ``lab down``) puts back.
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_PER_HOST = 8  # about 6 seen per host


def raise_sysctls(hosts: int) -> None:
    """Raise the machine limits ``hosts`` lab hosts need; their old values go to SYSCTL_SAVED."""
    try:
        current = int(INOTIFY_INSTANCES.read_text())
    except (OSError, ValueError):
        return
    want = 64 + INOTIFY_PER_HOST * hosts  # and what the machine's own processes hold
    if current >= want:
        return
    layout.SYSCTL_SAVED.write_text(json.dumps({str(INOTIFY_INSTANCES): current}) + "\n")
    INOTIFY_INSTANCES.write_text(f"{want}\n")


def restore_sysctls() -> None:
    """Put back what :func:`raise_sysctls` raised."""
    try:
        saved = json.loads(layout.SYSCTL_SAVED.read_text())
    except (OSError, ValueError):
        return
    for path, value in saved.items():
        if path == str(INOTIFY_INSTANCES):
            INOTIFY_INSTANCES.write_text(f"{int(value)}\n")
    layout.SYSCTL_SAVED.unlink()
