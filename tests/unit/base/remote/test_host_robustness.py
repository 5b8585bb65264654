"""Host programs against odd surroundings (issue #18 findings 11, 12, 15): the gate bypasses a
proxy the host's environment sets and reads a bounded reply; the runfile download times out and
is bounded, each in one line."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fake_host import Stub
from lab_sim_support import REPO, load

HEALTH = REPO / "src" / "servefleet" / "base" / "remote" / "health.py"
DRIVER = REPO / "src" / "servefleet" / "base" / "remote" / "driver.py"
health = load(HEALTH, "servefleet_remote_health_robust")
MODEL = "openai/gpt-oss-120b"


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_gate_passes_with_http_proxy_set(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = f"http://127.0.0.1:{dead_port()}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with Stub() as stub:
        assert health.probe(f"http://127.0.0.1:{stub.port}", MODEL, 5) is None


def test_the_gate_reads_a_bounded_chat_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "MAX_REPLY", 64)
    with Stub(chat={"choices": ["x" * 200]}) as stub:
        why = health.probe(f"http://127.0.0.1:{stub.port}", MODEL, 5)
    assert why == "chat completion reply is larger than 64 bytes"


@pytest.fixture
def silent_server() -> object:
    """A server that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/rebellions-x86_64-3.5.1.run"
    stop.set()
    thread.join(2)
    for c in held:
        c.close()
    sock.close()


def test_the_runfile_download_times_out_in_one_line(silent_server: str, tmp_path: Path) -> None:
    """A server that stalls is transient: tried again (here twice in all), then exit 3 ("could
    not reach", worth a later run) in one line."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import driver; "
        "driver.fetch(sys.argv[2], sys.argv[3], timeout=1, tries=2)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(DRIVER.parent), silent_server, str(tmp_path / "r.run")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 3
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "could not reach it (timed out (tried 2 times" in lines[0]


def test_a_refused_runfile_download_is_asked_once(tmp_path: Path) -> None:
    """A 404 is a refusal: asked once, one line, exit 1 (pyinfra no longer retries the step)."""
    import http.server

    asked = []

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            asked.append(self.path)
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/r.run"
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import driver; "
                "driver.fetch(sys.argv[2], sys.argv[3])")  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-c", code, str(DRIVER.parent), url, str(tmp_path / "r.run")],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 1 and asked == ["/r.run"]
    assert proc.stderr.strip() == (
        f"servefleet: {url}: cannot download the runfile (answered 404 Not Found)"
    )
