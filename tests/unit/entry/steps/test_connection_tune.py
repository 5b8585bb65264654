"""The deploy's SSH connection (steps/connection.py): keepalives, TCP_USER_TIMEOUT, and
TCP_NODELAY (paramiko leaves Nagle's algorithm on, and each remote command then waited for the
host's delayed ACK: about 50 ms a command on the lab, 8 ms without)."""

from __future__ import annotations

import socket
from typing import Any

from servefleet.entry.steps import connection


class Transport:
    def __init__(self, sock: Any) -> None:
        self.sock, self.keepalive = sock, None

    def set_keepalive(self, seconds: int) -> None:
        self.keepalive = seconds


def test_tune_sets_keepalive_user_timeout_and_nodelay() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as sock:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
            transport = Transport(sock)
            connection.tune(transport)
            assert transport.keepalive == connection.KEEPALIVE_SECONDS
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            timeout = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
            assert timeout == connection.DEAD_AFTER_SECONDS * 1000


def test_a_transport_without_a_socket_gets_its_keepalive_only() -> None:
    transport = Transport(object())  # a proxy command's channel, not a socket
    connection.tune(transport)
    assert transport.keepalive == connection.KEEPALIVE_SECONDS
