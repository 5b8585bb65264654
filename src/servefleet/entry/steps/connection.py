"""Each host's SSH connection, watched (issue #17).

paramiko has no dead-peer detection (no ServerAliveCountMax: paramiko/paramiko#2463, #918, #503):
a connection whose network goes silent (a switch reboot, a partition) leaves the controller
waiting on it until TCP gives up, about 15 minutes later, and a
connection that did drop fails whatever step was running, reported as that step's failure. Here:

- :func:`watch` turns on SSH keepalives and ``TCP_USER_TIMEOUT`` on the host's connection, so a
  silent one is known dead within ``KEEPALIVE_SECONDS + DEAD_AFTER_SECONDS`` even while a
  command prints nothing for hours (a compile); a short blip that TCP rides out costs nothing;
  and ``TCP_NODELAY``, so no command waits for a delayed ACK (:func:`tune`);
- a host whose connection is gone when an operation fails, or when the run ends, gets one line,
  ``servefleet: connection lost during '<operation>'``, instead of a failed step; ``servefleet
  rollout`` retries such a host once (:data:`servefleet.fleet.rollout.LOST`).

Only SSH connectors are watched (``@local`` and the others have no transport to lose).
"""

from __future__ import annotations

import socket
from typing import Any

from pyinfra import host, logger
from pyinfra.api.state import BaseStateCallback

from servefleet.fleet.rollout import LOST

KEEPALIVE_SECONDS = 5  # an SSH keepalive this often on an otherwise silent connection
DEAD_AFTER_SECONDS = 20  # unacknowledged data this long: the kernel drops the connection


def _transport(on: Any) -> Any:
    client = getattr(on.connector, "client", None)
    get = getattr(client, "get_transport", None)
    return get() if get is not None else None


def lost(on: Any) -> bool:
    """The host's SSH connection was up and is gone."""
    transport = _transport(on)
    return transport is not None and not transport.is_active()


class _Watch(BaseStateCallback):
    """Remembers each host's running operation; names it once when the connection is gone."""

    def __init__(self) -> None:
        self.running: dict[str, str] = {}
        self.told: set[str] = set()

    def operation_host_start(self, state: Any, on: Any, op_hash: str) -> None:  # type: ignore[override]
        self.running[on.name] = ", ".join(state.get_op_meta(op_hash).names) or "an operation"

    def operation_host_error(self, state: Any, on: Any, op_hash: str, *_: Any) -> None:  # type: ignore[override]
        self.tell(on)

    def host_disconnect(self, state: Any, on: Any) -> None:  # type: ignore[override]
        self.tell(on)  # a fact that failed inside an operation fails the host with no op error

    def tell(self, on: Any) -> None:
        if on.name in self.told or not lost(on):
            return
        self.told.add(on.name)
        where = self.running.get(on.name)
        during = f" during {where!r}" if where else ""
        logger.error(f"{on.print_prefix}servefleet: {LOST}{during} (retry: the steps converge)")


def watch() -> None:
    """Watch this host's connection (one watcher per run; setting the options again is a no-op)."""
    state = host.state
    if not any(isinstance(h, _Watch) for h in state.callback_handlers):
        state.add_callback_handler(_Watch())
    transport = _transport(host)
    if transport is not None:
        tune(transport)


def tune(transport: Any) -> None:
    """A paramiko transport's keepalive, its socket's ``TCP_USER_TIMEOUT`` and ``TCP_NODELAY``.

    paramiko leaves Nagle's algorithm on: each command's small requests then wait for the
    host's delayed ACK (Linux: 40 ms), so every remote command of a run cost about 50 ms instead
    of about 8 (bench/bench_suite.py measures it; OpenSSH sets TCP_NODELAY itself)."""
    transport.set_keepalive(KEEPALIVE_SECONDS)
    sock = transport.sock
    if not isinstance(sock, socket.socket):
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_AFTER_SECONDS * 1000)
