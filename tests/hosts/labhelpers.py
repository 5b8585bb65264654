"""Helpers of the lab host tests: run the servefleet CLI, bring a lab up, run a command on a host."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from servefleet.lab.fleet import ssh_command
from servefleet.lab.state import load_state

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


def on_host(
    state: dict[str, Any],
    host: str,
    command: str,
    stdin: str | None = None,
    check: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run a shell command on a lab host over ssh (as root)."""
    proc = subprocess.run(
        ssh_command(state, host, [command]),
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
