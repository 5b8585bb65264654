"""A fake host for unit tests of the host-side scripts (src/servefleet/base/remote/).

+ ``FakeSystemd``: ``systemctl`` and ``journalctl`` executables on PATH that answer from files
  the test writes, and log every call.
+ ``Stub``: a vllm-like HTTP server on 127.0.0.1 (random free port) in a thread, answering
  ``/health`` and ``/v1/chat/completions`` as configured (with ``api_key``, as vLLM's
  ``--api-key``: every ``/v1`` request without ``Authorization: Bearer KEY`` gets 401).
+ ``stub_process``: the same stub in a subprocess (a listener that is not the test's own).
+ ``serving``: any ``ThreadingHTTPServer`` run in a thread for the length of a ``with``.

``python fake_host.py serve CONFIG_JSON`` runs a stub and prints its port (used by
``stub_process``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPLY = {
    "id": "chatcmpl-stub",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "p"}}],
}

FAKE_TOOL = """#!{python}
# A fake {{systemctl,journalctl}} written by tests/unit/fake_host.py: answers from {state}.
import json, sys
from pathlib import Path

state = Path({state!r})
tool, args = Path(sys.argv[0]).name, sys.argv[1:]
with open(state / "calls.jsonl", "a") as log:
    log.write(json.dumps([tool, *args]) + "\\n")
if tool == "journalctl":
    journal = state / "journal.txt"
    sys.stdout.write(journal.read_text() if journal.exists() else "")
    sys.exit(0)
verb = next((a for a in args if not a.startswith("-")), "")
if verb == "show":
    answers = json.loads((state / "show.json").read_text())
    count = state / "show.count"
    n = int(count.read_text()) if count.exists() else 0
    count.write_text(str(n + 1))
    props = answers[min(n, len(answers) - 1)]
    wanted = [b for a, b in zip(args, args[1:]) if a == "-p"]
    for key, value in props.items():
        if not wanted or key in wanted:
            print(f"{{key}}={{value}}")
    sys.exit(0)
rc = state / (verb + ".rc")
sys.exit(int(rc.read_text()) if rc.exists() else 0)
"""


def running(**props: Any) -> dict[str, Any]:
    """``systemctl show`` properties of a running service, with ``props`` over them."""
    base: dict[str, Any] = {
        "LoadState": "loaded",
        "ActiveState": "active",
        "SubState": "running",
        "Result": "success",
        "NRestarts": 0,
        "ExecMainCode": 0,
        "ExecMainStatus": 0,
        "MainPID": 0,
        "ControlGroup": "",
    }
    return base | props


class FakeSystemd:
    """``systemctl``/``journalctl`` in ``root/bin``; their answers and call log in ``root/state``.

    ``systemctl show`` prints the requested ``-p`` properties of the next answer given to
    ``show`` (the last answer repeats); other verbs exit 0, or the status in ``state/VERB.rc``.
    ``journalctl`` prints the text given to ``journal``."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.state = root / "state"
        self.bin.mkdir(parents=True)
        self.state.mkdir(parents=True)
        script = FAKE_TOOL.format(python=sys.executable, state=str(self.state))
        for tool in ("systemctl", "journalctl"):
            path = self.bin / tool
            path.write_text(script)
            path.chmod(0o755)
        self.show(running())

    def env(self) -> dict[str, str]:
        """The environment with the fakes first on PATH."""
        return dict(os.environ, PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}")

    def show(self, *answers: Mapping[str, Any]) -> None:
        """Answers to the next ``systemctl show`` calls, in order; the last one repeats."""
        (self.state / "show.json").write_text(json.dumps(list(answers)))
        (self.state / "show.count").unlink(missing_ok=True)

    def journal(self, text: str) -> None:
        (self.state / "journal.txt").write_text(text)

    def calls(self) -> list[list[str]]:
        """Every call so far, as argv with the tool's name first."""
        log = self.state / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


class Stub:
    """A vllm-like server on 127.0.0.1: ``/health`` answers ``health``, the chat completion
    ``chat`` (a JSON body) with ``chat_status``; with ``api_key`` a ``/v1`` request without
    ``Authorization: Bearer <api_key>`` gets 401. Requests are kept in ``requests``, their
    Authorization headers (or None) in ``auth``."""

    def __init__(
        self,
        health: int = 200,
        chat: Any = REPLY,
        chat_status: int = 200,
        port: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.health, self.chat, self.chat_status = health, chat, chat_status
        self.api_key = api_key
        self.requests: list[tuple[str, Any]] = []
        self.auth: list[str | None] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.port = int(self.server.server_address[1])
        self._running = ExitStack()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _refused(self) -> bool:
                """vLLM's --api-key: /v1/* need the key, /health stays open."""
                stub.auth.append(self.headers.get("Authorization"))
                if stub.api_key is None or not self.path.startswith("/v1"):
                    return False
                if self.headers.get("Authorization") == f"Bearer {stub.api_key}":
                    return False
                self._answer(401, b'{"error": "Unauthorized"}')
                return True

            def do_GET(self) -> None:
                stub.requests.append((self.path, None))
                if self._refused():
                    return
                code = stub.health if self.path == "/health" else 404
                self._answer(code, b"" if code == 200 else b'{"error": "stub"}')

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                stub.requests.append((self.path, json.loads(self.rfile.read(length) or b"null")))
                if self._refused():
                    return
                if self.path != "/v1/chat/completions":
                    self._answer(404, b"{}")
                else:
                    self._answer(stub.chat_status, json.dumps(stub.chat).encode())

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> Stub:
        self._running.enter_context(serving(self.server))
        return self

    def __exit__(self, *exc: object) -> None:
        self._running.close()


@contextmanager
def serving(server: ThreadingHTTPServer) -> Iterator[str]:
    """Run ``server`` in a thread: yields its base URL; shut down and closed on exit."""
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def stub_process(**config: Any) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A ``Stub(**config)`` in a subprocess: yields the process and its port."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "serve", json.dumps(config)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield proc, port
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    stub = Stub(**json.loads(sys.argv[2]))
    print(stub.port, flush=True)
    stub.server.serve_forever()
