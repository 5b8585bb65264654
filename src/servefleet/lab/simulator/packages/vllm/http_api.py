"""The OpenAI-style HTTP API of the simulated server: /health (the fail-health switch),
/v1/models, /version, /metrics and POST /v1/chat/completions (a fixed, predictable reply). A
SIMULATION for the servefleet lab."""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from .checks import fault_switch
from .common import VERSION

_REPLY_WORDS = (
    "This is a simulated reply from the servefleet lab; no model ran to produce these words, "
    "which repeat in a fixed order so that tests can predict them"
).split()


class _State:
    def __init__(self, ns: argparse.Namespace, env: Mapping[str, str], info: dict[str, Any]):
        self.ns = ns
        self.env = env
        self.info = info
        self.argv = list(sys.argv)  # this process's command line, for the fail-health switch
        self.names: list[str] = [n for n in ns.served_model_name or [] if n] or [ns.model]
        self.requests = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.started = int(time.time())


def _make_handler(state: _State) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "vllm-sim/" + VERSION

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            sys.stderr.write(f"INFO: {self.address_string()} {format % args}\n")

        def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            if path == "/health":
                failing = fault_switch(state.env, "fail-health", state.argv) is not None
                self._send(500 if failing else 200, b"", "text/plain")
            elif path == "/v1/models":
                data = [
                    {
                        "id": name,
                        "object": "model",
                        "created": state.started,
                        "owned_by": "vllm",
                        "root": state.ns.model,
                        "parent": None,
                        "max_model_len": state.ns.max_model_len,
                    }
                    for name in state.names
                ]
                self._send(200, {"object": "list", "data": data})
            elif path == "/version":
                self._send(200, {"version": VERSION})
            elif path == "/metrics":
                self._send(200, _metrics(state).encode(), "text/plain; version=0.0.4")
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path.split("?")[0] != "/v1/chat/completions":
                self._send(404, {"detail": "Not Found"})
                return
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                req = json.loads(raw)
                assert isinstance(req, dict) and isinstance(req.get("messages"), list)
            except (ValueError, AssertionError):
                self._send(400, _error("invalid request: expected a JSON object with messages"))
                return
            if req.get("model") not in state.names:
                msg = f"The model `{req.get('model')}` does not exist."
                self._send(404, _error(msg, "NotFoundError", 404))
                return
            self._send(200, _chat(state, req, raw))

    return Handler


def _error(message: str, kind: str = "BadRequestError", code: int = 400) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _chat(state: _State, req: dict[str, Any], raw: bytes) -> dict[str, Any]:
    limit = req.get("max_tokens") or req.get("max_completion_tokens") or 16
    limit = max(1, int(limit))
    n = min(limit, len(_REPLY_WORDS))
    text = " ".join(_REPLY_WORDS[:n])
    prompt = sum(len(str(m.get("content", "")).split()) for m in req["messages"])
    state.requests += 1
    state.prompt_tokens += prompt
    state.generation_tokens += n
    return {
        "id": "chatcmpl-" + hashlib.sha1(raw).hexdigest()[:16],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length" if n == limit else "stop",
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n},
    }


def _metrics(state: _State) -> str:
    label = f'model_name="{state.names[0]}"'
    rows = [
        ("vllm:num_requests_running", "gauge", 0),
        ("vllm:num_requests_waiting", "gauge", 0),
        ("vllm:request_success_total", "counter", state.requests),
        ("vllm:prompt_tokens_total", "counter", state.prompt_tokens),
        ("vllm:generation_tokens_total", "counter", state.generation_tokens),
        ("vllm_sim:compiled_at_start", "gauge", int(state.info["compiled"])),
    ]
    out = []
    for name, kind, value in rows:
        out += [f"# TYPE {name} {kind}", f"{name}{{{label}}} {value}"]
    return "\n".join(out) + "\n"
