"""Helpers of the lab host tests: run the servefleet CLI, bring a lab up, run a command on a host."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from servefleet.fleet.lab.hosts import ssh_command
from servefleet.fleet.lab.state import load_state

LAB_HOSTS = 3


def servefleet(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the servefleet CLI (this interpreter's install) and capture its output."""
    proc = subprocess.run(
        [sys.executable, "-m", "servefleet", *args], capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"servefleet {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def lab_up(*extra: str) -> dict[str, Any]:
    servefleet("lab", "up", "--hosts", str(LAB_HOSTS), *extra)
    return load_state()


@contextmanager
def relabbed(lab: dict[str, Any], *up_args: str) -> Iterator[dict[str, Any]]:
    """The session lab re-upped with ``servefleet lab up UP_ARGS`` for one test, and as it was
    (``lab_up()``) after, whatever the test did.

    + lab: the session's lab state (updated in place)
    + up_args: the arguments of ``lab up``
    """
    lab.clear()
    servefleet("lab", "up", *up_args)
    lab.update(load_state())
    try:
        yield lab
    finally:
        lab.clear()
        lab.update(lab_up())


def shared_connection(state: dict[str, Any]) -> list[str]:
    """ssh options that run each command over one connection per lab host (OpenSSH's control
    master), opened by the first and closed ``ControlPersist`` seconds after the last: a new
    connection costs about 0.15 s of key exchange and login, a session on an open one about
    0.02 s. The sockets are in this lab's own state (root's; ``lab down`` and the next ``lab up``
    remove them), so a new lab never reaches a master of an old one."""
    sockets = Path(state["ssh"]["known_hosts"]).parent / "test-mux"
    if not sockets.parent.is_dir():
        return []  # no lab: the command fails as ssh fails
    sockets.mkdir(mode=0o700, exist_ok=True)
    return [
        "-o",
        "ControlMaster=auto",
        "-o",
        f"ControlPath={sockets}/%C",
        "-o",
        "ControlPersist=15",
    ]


def on_host(
    state: dict[str, Any],
    host: str,
    command: str,
    stdin: str | None = None,
    check: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run a shell command on a lab host over ssh (as root), on the host's shared connection."""
    ssh, *argv = ssh_command(state, host, [command])
    proc = subprocess.run(
        [ssh, *shared_connection(state), *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{host}: {command!r} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll ``condition()`` until it holds; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} (after {timeout} s)"
        time.sleep(0.2)
