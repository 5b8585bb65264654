"""The host tests' pyinfra runs, each the real pyinfra CLI in a process of its own, forked from this
one after it has imported pyinfra and servefleet's deploy code once: a run's own import costs
about 0.6 CPU-s, most of what a run refused before any operation spends.

``forked_pyinfra.py SOCKET`` listens on the Unix socket SOCKET (SOCK_SEQPACKET) and prints
``ready``; when its stdin ends it waits for its children and exits (so what they used counts as
its children's CPU time). Each connection is one run: the client sends ``{"argv": [ARG, ...],
"env": {...}, "cwd": DIR}`` (JSON) with the descriptors of the run's stdout and stderr; the
child it is forked into (a session of its own, stdin /dev/null) says ``{"pid": PID}``, runs
pyinfra's ``main()`` with that argv, environment and directory as ``pyinfra ARGS...`` does, says
``{"returncode": CODE}`` and exits with it. ``faults.pyinfra`` is the client."""

# ruff: noqa: I001, E402 - pyinfra_cli.main first: it patches the standard library for gevent
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# as for the pyinfra script: its own directory first on the path, not this one's
sys.path[0] = str(Path(sys.executable).parent)

import contextlib
import json
import os
import signal
import socket
import traceback

from pyinfra_cli.main import main

import gevent.monkey
import gevent.os
import servefleet.entry.deploys  # noqa: F401 - what deploys/*.py import: imported once, here

# this process runs no gevent loop: the standard library's own socket, select, signal, waitpid
Socket = gevent.monkey.get_original("socket", "socket")
select = gevent.monkey.get_original("select", "select")
set_signal = gevent.monkey.get_original("signal", "signal")
waitpid = gevent.monkey.get_original("os", "waitpid")
PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def say(conn: socket.socket, message: dict[str, int]) -> None:
    conn.send(json.dumps(message).encode())


def child(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: the run, then its exit code on ``conn``. Exits."""
    code = 1
    try:
        os.setsid()
        set_signal(signal.SIGCHLD, signal.SIG_DFL)  # the run waits for its own children
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((0, null), (1, fds[0]), (2, fds[1])):
            os.dup2(target, fd)
        for fd in (null, *fds):
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [PYINFRA, *request["argv"]]
        say(conn, {"pid": os.getpid()})
        main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else int(done.code is not None)
    except BaseException:  # noqa: BLE001 - shown as an uncaught exception is, exit 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            say(conn, {"returncode": code})
        finally:
            os._exit(code)


def reap(*_: object) -> None:
    """Every child that has ended (on SIGCHLD)."""
    with contextlib.suppress(ChildProcessError):
        while waitpid(-1, os.WNOHANG)[0]:
            pass


def serve(path: str) -> None:
    listener = Socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    set_signal(signal.SIGCHLD, reap)
    print("ready", flush=True)
    while True:
        readable, _, _ = select([listener, sys.stdin], [], [])
        if sys.stdin in readable and not sys.stdin.buffer.read1(1):
            break  # the client is gone
        if listener in readable:
            conn, _ = listener.accept()
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
            if gevent.os.fork_gevent() == 0:  # gevent made ready in the child, none watched here
                listener.close()
                child(conn, json.loads(data), fds)
            for fd in fds:
                os.close(fd)
            conn.close()
    set_signal(signal.SIGCHLD, signal.SIG_DFL)
    with contextlib.suppress(ChildProcessError):
        while True:
            waitpid(-1, 0)


if __name__ == "__main__":
    serve(sys.argv[1])
