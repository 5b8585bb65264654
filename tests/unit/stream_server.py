"""A tiny OpenAI-compatible streaming server on 127.0.0.1, in this process, for the canary
analysis' probe (tests/unit/fleet/analysis/): POST /v1/chat/completions and /v1/completions
stream server-sent events in a chunked HTTP/1.1 body as vLLM does (one event a token, a usage
event when ``stream_options.include_usage`` asks, then ``data: [DONE]``); GET /metrics answers
vLLM's counters and histograms in the text exposition, counting what it served. Its timing is
its own: the first token after ``ttft`` seconds, the next ones ``itl`` apart (each times
``jitter(i)`` when given), so a test makes one server slower than another. ``stall`` holds every
answer after its headers (the probe's deadline must end it); ``fail_every`` answers every Nth
request 500; ``key`` is the API key it wants (401 without it); ``odd`` answers a path with bytes
of the test's, as they are (a hostile instance). Every request's headers are kept (``seen``) so a
test can check what the probe sent where.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "openai/gpt-oss-120b"
BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0)


@dataclass
class Behaviour:
    """How one server answers (see the module's docstring)."""

    ttft: float = 0.01
    itl: float = 0.002
    jitter: Callable[[int], float] | None = None  # request number -> its timing's factor
    stall: bool = False
    fail_every: int = 0
    key: str | None = None
    extra_metrics: str = ""  # appended to /metrics as it is (a test's unknown metric)
    odd: dict[str, bytes] = field(default_factory=dict)  # path -> its whole answer, as it is
    seen: list[dict[str, str]] = field(default_factory=list)  # every request's headers
    prompts: list[str] = field(default_factory=list)  # every completion's prompt, in order
    served: int = 0
    tokens: int = 0
    ttfts: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)  # ends a stall


def _histogram(name: str, values: list[float]) -> list[str]:
    lab = f'model_name="{MODEL}",engine="0"'
    lines = [f"# HELP {name} x", f"# TYPE {name} histogram"]
    for le in BUCKETS:
        lines.append(f'{name}_bucket{{{lab},le="{le}"}} {sum(v <= le for v in values)}')
    lines.append(f'{name}_bucket{{{lab},le="+Inf"}} {len(values)}')
    lines += [f"{name}_count{{{lab}}} {len(values)}", f"{name}_sum{{{lab}}} {sum(values)}"]
    return lines


def metrics_text(b: Behaviour) -> str:
    lab = f'model_name="{MODEL}",engine="0"'
    lines = [
        "# HELP vllm:generation_tokens_total x",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{lab}}} {float(b.tokens)}",
        "# HELP vllm:request_success_total x",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{lab},finished_reason="length"}} {float(b.served)}',
        "# HELP vllm:num_requests_running x",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lab}}} 0.0",
        *_histogram("vllm:time_to_first_token_seconds", b.ttfts),
    ]
    return "\n".join(lines) + "\n" + b.extra_metrics


def _handler(b: Behaviour) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _odd(self) -> bool:
            """Answer the test's bytes for this path, if it gave any, and close."""
            if self.path not in b.odd:
                return False
            self.wfile.write(b.odd[self.path])
            self.close_connection = True
            return True

        def do_GET(self) -> None:  # noqa: N802
            b.seen.append({"path": self.path, **dict(self.headers)})
            if self._odd():
                return
            wanted = f"Bearer {b.key}"
            if (
                b.key
                and self.path.startswith("/v1/")
                and self.headers.get("Authorization") != wanted
            ):
                self._send(401, b'{"error": "Unauthorized"}')
            elif self.path == "/metrics":
                self._send(200, metrics_text(b).encode(), "text/plain; version=0.0.4")
            else:
                self._send(200, json.dumps({"data": [{"id": MODEL}]}).encode())

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            b.seen.append({"path": self.path, **dict(self.headers)})
            if self._odd():
                return
            with b.lock:
                b.prompts.append(str(body.get("prompt") or body.get("messages")))
                n = len([s for s in b.seen if s["path"].startswith("/v1/")])
            if b.key is not None and self.headers.get("Authorization") != f"Bearer {b.key}":
                return self._send(401, b'{"error": "Unauthorized"}')
            if b.fail_every and n % b.fail_every == 0:
                return self._send(500, b'{"error": "failed"}')
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            if b.stall:
                b.release.wait(30)
                return
            factor = b.jitter(n) if b.jitter else 1.0
            chat = self.path.startswith("/v1/chat/")
            want = int(body.get("max_tokens") or 16)
            t0 = time.monotonic()
            for i in range(want):
                time.sleep((b.ttft if i == 0 else b.itl) * factor)
                if i == 0:
                    with b.lock:
                        b.ttfts.append(time.monotonic() - t0)
                piece = {"delta": {"content": f"w{i} "}} if chat else {"text": f"w{i} "}
                event = {"id": "x", "model": MODEL, "choices": [{"index": 0, **piece}]}
                self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": 10, "completion_tokens": want, "total_tokens": want + 10}
                event = {"id": "x", "model": MODEL, "choices": [], "usage": usage}
                self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
            with b.lock:
                b.served += 1
                b.tokens += want

    return Handler


@contextmanager
def streaming(b: Behaviour) -> Iterator[str]:
    """A server answering as ``b`` says, on a loopback port: yields its origin."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(b))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        b.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
