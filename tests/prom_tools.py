"""Debian's promtool and prometheus for the monitoring kit's tests, found in one place: the
``prometheus`` package setup.sh unpacks into ``.venv/prometheus`` (never installed: no service,
no user), else ``PATH``. A missing one fails the test with one line naming setup.sh, never a
skip. :class:`Prometheus` runs a real one on a loopback port with a directory of its own, for
tests/unit/fleet/monitoring/ and tests/hosts/test_prometheus.py."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
UNPACKED = "prometheus/usr/bin"  # below a venv: where setup.sh unpacks Debian's package


def prom_tool(name: str) -> str:
    """The path of ``promtool`` or ``prometheus``: this venv's unpacked copy (the repository's
    ``.venv`` when the tests run from another), else one on ``PATH``.

    + name: ``promtool`` or ``prometheus``
    """
    for venv in dict.fromkeys((Path(sys.prefix), REPO / ".venv")):
        path = venv / UNPACKED / name
        if os.access(path, os.X_OK):
            return str(path)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(
        f"{name} not found in {REPO / '.venv' / UNPACKED} nor on PATH: run ./setup.sh (it "
        "unpacks Debian's prometheus package there)",
        pytrace=False,
    )


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS``, its output captured."""
    return subprocess.run([prom_tool("promtool"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def loopback_port(first: int = 19000, count: int = 1000) -> int:
    """A loopback port free now, from a block of its own below the unit tests' (20000-31999)
    and the kernel's ephemeral range, where other clients' connections take ports."""
    for port in range(first, first + count):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {first}-{first + count - 1}")


@contextmanager
def http_server(answer: Callable[[str], tuple[int, bytes]], kind: str) -> Iterator[int]:
    """A threaded HTTP server on 127.0.0.1 answering each GET with ``answer(path)`` (status,
    body) as ``kind`` (a Content-Type), for as long as the block runs: its port (the kernel's,
    taken by its own bind).

    + answer: path -> (HTTP status, body)
    + kind: the Content-Type of every answer
    """

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            code, body = answer(self.path)
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class Prometheus:
    """A real Prometheus on 127.0.0.1 with ``config`` (a prometheus.yml text) and its own data
    directory under ``workdir``, ready when entered, always stopped when left.

    + workdir: its directory (the config, the TSDB, its log)
    + config: the prometheus.yml text
    """

    def __init__(self, workdir: Path, config: str) -> None:
        self.workdir, self.port = workdir, loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "prometheus.yml").write_text(config)
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        log = (self.workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [prom_tool("prometheus"), f"--config.file={self.workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=log, stderr=log, cwd=self.workdir,
        )  # fmt: skip
        log.close()
        try:
            deadline = time.monotonic() + 60
            while not self._ready():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"prometheus did not get ready:\n{self.log()[-3000:]}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)

    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        """``/api/v1/PATH``'s ``data`` (its HTTP API)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's samples: each one's labels and value."""
        return [{"labels": s["metric"], "value": float(s["value"][1])}
                for s in self.api("query", query=expr)["result"]]  # fmt: skip

    def firing(self, alert: str) -> list[dict[str, str]]:
        """The labels of each firing alert of that name (``/api/v1/alerts``)."""
        return [a["labels"] for a in self.api("alerts")["alerts"]
                if a["labels"].get("alertname") == alert and a["state"] == "firing"]  # fmt: skip
