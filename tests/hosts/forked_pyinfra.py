"""Many runs of the real pyinfra CLI, each in a process of its own, forked from this one after it
has imported pyinfra and servefleet's deploy code once: most of the CPU that a run refused
before any operation spends (the bad-data matrix: about 150 runs) goes to that import.

Each child runs pyinfra's own ``main()`` with its own argv, as ``pyinfra ARGS...`` does: it
loads the inventory, connects to the hosts, loads the deploy file and exits with pyinfra's code,
its stdout and stderr in files of their own. A program (``faults.run_many``): reads
``{"runs": [[ARG, ...], ...], "parallel": N}`` (JSON) on stdin, writes one JSON list of
``{"returncode", "stdout", "stderr"}`` on stdout, in the order of the runs."""

# ruff: noqa: I001 - pyinfra_cli.main first: it patches the standard library for gevent
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from pyinfra_cli.main import main

import gevent.monkey
import gevent.os
import servefleet.deploys  # noqa: F401 - what deploys/*.py import: imported once, here

# the blocking waitpid: this process runs no gevent loop (gevent's would watch for children)
waitpid = gevent.monkey.get_original("os", "waitpid")


def child(args: list[str], out: Path, err: Path) -> None:
    """In a forked child: ``pyinfra ARGS``, stdout in ``out`` and stderr in ``err``. Exits."""
    code = 1
    try:
        for fd, path in ((1, out), (2, err)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        sys.argv = ["pyinfra", *args]
        main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else int(done.code is not None)
    except BaseException:  # noqa: BLE001 - shown as an uncaught exception is, exit 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_all(runs: list[list[str]], parallel: int) -> list[dict[str, Any]]:
    """Every run, at most ``parallel`` at a time; their results in the order of ``runs``."""
    results: list[dict[str, Any]] = [{} for _ in runs]
    with tempfile.TemporaryDirectory(prefix="forked-pyinfra-") as tmp:
        files = [(Path(tmp, f"{i}.out"), Path(tmp, f"{i}.err")) for i in range(len(runs))]
        pending = list(range(len(runs)))
        running: dict[int, int] = {}  # pid -> the index of its run
        while pending or running:
            while pending and len(running) < parallel:
                i = pending.pop(0)
                pid = gevent.os.fork_gevent()  # the child's gevent hub is its own
                if pid == 0:
                    child(runs[i], *files[i])
                running[pid] = i
            pid, status = waitpid(-1, 0)
            i = running.pop(pid)
            out, err = (p.read_text(errors="replace") for p in files[i])
            code = os.waitstatus_to_exitcode(status)
            results[i] = {"returncode": code, "stdout": out, "stderr": err}
    return results


if __name__ == "__main__":
    request = json.load(sys.stdin)
    json.dump(run_all(request["runs"], int(request["parallel"])), sys.stdout)
