"""The real pyinfra CLI, with the controller's write of a command's stdin delayed by
``SLOW_STDIN_SECONDS`` (default 0.5): what a loaded controller does when many hosts' greenlets
share two cores. Any command that gets stdin it does not read has exited, and its channel closed,
by the time the write comes; paramiko then raises ``OSError('Socket is closed')`` (issue #17's
reproducer: ``python tests/hosts/slow_stdin.py -y INVENTORY DEPLOY``)."""

# ruff: noqa: I001 - pyinfra_cli.main first: it patches the standard library for gevent
from __future__ import annotations

import os
import sys
import time

from pyinfra_cli.main import main

import pyinfra.connectors.ssh as ssh

_write_stdin = ssh.write_stdin
DELAY = float(os.environ.get("SLOW_STDIN_SECONDS", "0.5"))


def slow_write_stdin(stdin: object, buffer: object) -> None:
    time.sleep(DELAY)  # a gevent sleep: the other hosts' greenlets run meanwhile
    _write_stdin(stdin, buffer)


ssh.write_stdin = slow_write_stdin  # type: ignore[assignment]

if __name__ == "__main__":
    sys.argv[0] = "pyinfra"
    sys.exit(main())
