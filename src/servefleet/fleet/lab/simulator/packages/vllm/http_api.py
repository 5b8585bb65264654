"""The OpenAI-style HTTP API of the simulated server: /health (the fail-health switch),
/v1/models, /version, /metrics (:mod:`vllm.serving_metrics`), POST /v1/chat/completions and
/v1/completions (a fixed, predictable reply, whole or streamed, timed by the timing model:
:mod:`vllm.generation`), the unkeyed POST /invocations (either, by the body) and
/scale_elastic_ep (checked, then a failed scale), ``--middleware`` around all of them
(:mod:`vllm.middleware`), the API key, the engine's queue and the shutdown
(:mod:`vllm.lifecycle`). HTTP/1.1; a streamed answer is chunked, as uvicorn sends it. One thread
per connection (``ThreadingHTTPServer``): requests run concurrently, each waits on events, never
polls. A SIMULATION for the servefleet lab.

API key, as vLLM's ``AuthenticationMiddleware`` enforces it: the keys are ``--api-key`` (one or
more), else ``$VLLM_API_KEY``; empty keys do not count, and without one every path is open.
With keys, every request whose path starts with one of vLLM's ``GUARDED_PREFIX`` (``/v1``,
``/v2``, ``/inference``, ``/cohere``; OPTIONS excepted) needs ``Authorization: Bearer KEY`` (the
scheme in any case) naming one of them, else 401 with ``{"error": "Unauthorized"}``, before the
path is routed; /health, /metrics and /version stay open. A served path asked with another
method answers 405, as FastAPI does.

The routes and the guard are checked against the real wheel's app and middleware
(tests/realvllm/test_trusted.py; the real routes: ``flags/vllm-0.30.0-routes.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .checks import fault_switch
from .common import VERSION, SimError, _log
from .generation import (
    Job,
    RequestError,
    Timing,
    answer,
    error_body,
    first_events,
    last_events,
    parse_job,
    slowdown,
    timing_of,
    token_event,
    tokens_per_second,
)
from .kv_transfer import INTERNAL_ERROR, ROLES, Engine, KVTransfer, TransferError, role_of
from .lifecycle import Flight, Requests
from .middleware import Stack
from .serving_metrics import EngineStats

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}  # POST
# vLLM's routes its API key does not guard that run inference or change the engine (POST):
# SageMaker's /invocations (a chat or a completion, by the body) and the elastic EP scaling
UNKEYED_POSTS = ("/invocations", "/scale_elastic_ep")
GET_ROUTES = ("/health", "/v1/models", "/version", "/metrics")  # /metrics last: any method
# vllm/entrypoints/serve/middleware/authenticate.py: GUARDED_PREFIX
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
SHUTTING_DOWN = "The server is shutting down and takes no new requests."
# vllm/v1/engine/exceptions.py: EngineDeadError's message
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
MAX_BODY = 1 << 24  # bytes of a request body the server reads
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # prometheus_client's, for text 0.0.4


def api_key_hashes(ns: argparse.Namespace, env: Mapping[str, str]) -> list[bytes]:
    """The sha256 of each API key the server requires: ``--api-key``'s, else
    ``$VLLM_API_KEY``'s (vLLM: the flag takes precedence); empty keys do not count."""
    keys = [k for k in (ns.api_key or [env.get("VLLM_API_KEY", "")]) if k]
    return [hashlib.sha256(k.encode()).digest() for k in keys]


def guarded(method: str, path: str) -> bool:
    """Whether a request needs the API key (when the server has one): vLLM's middleware."""
    return method != "OPTIONS" and path.startswith(GUARDED_PREFIXES)


def authorized(hashes: list[bytes], header: str | None) -> bool:
    """Whether an ``Authorization`` header names one of the keys (compared by their hashes,
    in constant time, as vLLM does)."""
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    digest = hashlib.sha256(token.encode()).digest()
    match = False
    for h in hashes:
        match |= secrets.compare_digest(digest, h)
    return match


class APIServer(http.server.ThreadingHTTPServer):
    """The HTTP server: a daemon thread per connection, and uvicorn's listen backlog (2048; the
    standard library's 5 would make a burst of new connections wait for SYN retries)."""

    request_queue_size = 2048
    daemon_threads = True


class _State:
    def __init__(
        self,
        ns: argparse.Namespace,
        env: Mapping[str, str],
        info: dict[str, Any],
        kv: KVTransfer | None = None,
        group: Any = None,
    ):
        self.ns = ns
        self.env = env
        self.info = info
        self.kv = kv  # the NIXL connector, None without one
        self.group = group  # its part in a multi-node group (vllm.group_head), None alone
        self.argv = list(sys.argv)  # this process's command line, for the fail-health switch
        self.subject = f"{sys.prefix} {' '.join(self.argv)}"  # what the slowdown switch matches
        self.names: list[str] = [n for n in ns.served_model_name or [] if n] or [ns.model]
        self.keys = api_key_hashes(ns, env)
        # --middleware, built with the app (a name that does not import fails the start here)
        self.middleware = Stack(
            getattr(ns, "middleware", None) or [], getattr(ns, "root_path", None) or ""
        )
        self.requests = Requests(timing_of(ns, 1.0).max_num_seqs)  # the queue of --max-num-seqs
        self.stats = EngineStats()
        self.roles = dict.fromkeys(ROLES, 0)  # requests ended, by the part they played
        self.started = int(time.time())
        self._lock = threading.Lock()

    def timing(self) -> Timing:
        """The timing model for a new request: the lab's rate and slowdown read now."""
        rate = tokens_per_second(self.env)
        return timing_of(self.ns, rate, slowdown(self.env, self.subject))

    def count(self, job: Job, flight: Flight, role: str) -> None:
        """A generation request that played ``role`` has ended (a success: every token): it
        leaves the batch and is counted in /metrics."""
        self.requests.unschedule(flight)
        reason = "length" if flight.generated == job.max_tokens else "abort"
        self.stats.finished_request(flight, reason, time.monotonic())
        with self._lock:
            self.roles[role] += 1


def engine_dead(state: _State) -> bool:
    """Whether the server's engine is dead: a rank of its group went away after it served."""
    return state.group is not None and state.group.dead.is_set()


class _Cut(Exception):
    """The request stops here: the shutdown aborted it, or the client went away."""


def _make_handler(state: _State) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "vllm-sim/" + VERSION
        protocol_version = "HTTP/1.1"
        ended: Callable[[], None] | None = None  # counts the request in hand (see _end)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            sys.stderr.write(f"INFO: {self.address_string()} {format % args}\n")

        def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _passed(self, body: bytes = b"") -> bool:
            """The request went through --middleware to the routes (else its answer is sent)."""
            address: Any = self.server.server_address
            host, port = address[:2]
            answer = state.middleware.answer(
                self.command, self.path, list(self.headers.items()), body,
                self.client_address[:2], (str(host), int(port)),
            )  # fmt: skip
            if answer is None:
                return True
            code, headers, data = answer
            self.send_response(code)
            for name, value in headers:
                self.send_header(name, value)
            if not any(name.lower() == "content-length" for name, _ in headers):
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return False

        def _authorized(self) -> bool:
            """vLLM's middleware: with keys, a guarded path needs one (else 401 is sent here)."""
            path = self.path.split("?")[0]
            if not state.keys or not guarded(self.command, path):
                return True
            if authorized(state.keys, self.headers.get("Authorization")):
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:  # noqa: N802
            if not self._passed() or not self._authorized():
                return
            path = self.path.split("?")[0]
            if path == "/health":
                if state.requests.draining or engine_dead(state):  # vLLM: EngineDeadError
                    code = 503
                else:
                    failing = fault_switch(state.env, "fail-health", state.argv) is not None
                    code = 500 if failing else 200
                self._send(code, b"", "text/plain")
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
                self._send(200, _metrics(state).encode(), METRICS_TYPE)
            elif path in ROUTES or path in UNKEYED_POSTS:
                self._send(405, {"detail": "Method Not Allowed"})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            arrived = time.monotonic()
            length = self.headers.get("Content-Length") or "0"
            if not length.isdigit() or int(length) > MAX_BODY:
                self.close_connection = True  # the body cannot be skipped
                self._send(
                    400, error_body(f"Content-Length must be 0 to {MAX_BODY}, not {length[:20]!r}")
                )
                return
            raw = self.rfile.read(int(length))
            if not self._passed(raw) or not self._authorized():
                return
            path = self.path.split("?")[0]
            kind = ROUTES.get(path)
            if path == "/scale_elastic_ep":
                self._send(*scale_answer(raw))
                return
            if path == "/invocations":
                kind, refusal = invocation_kind(raw)
                if refusal is not None:
                    self._send(400, refusal)
                    return
            if kind is None:
                if self.path.split("?")[0] in GET_ROUTES[:-1]:  # /metrics: a mount, any method
                    self._send(405, {"detail": "Method Not Allowed"})
                else:
                    self._send(404, {"detail": "Not Found"})
                return
            try:
                request_id = self.headers.get("X-Request-Id")
                job = parse_job(kind, raw, state.names, state.ns.max_model_len, request_id)
                timing = state.timing()
            except RequestError as exc:
                self._send(exc.code, exc.body)
                return
            except SimError as exc:
                self._send(500, error_body(str(exc), "InternalServerError", 500))
                return
            if engine_dead(state):
                _log("EngineDeadError: EngineCore encountered an issue.", "ERROR")
                self._send(500, error_body(ENGINE_DEAD, "InternalServerError", 500))
                return
            if not state.requests.admit():
                self._send(503, error_body(SHUTTING_DOWN, "ServiceUnavailableError", 503))
                return
            aborted = False
            flight = Flight(prompt=job.prompt_tokens, arrived=arrived)
            role = role_of(state.kv, job.kv_transfer_params)
            engine = state.kv.engine(self.headers.get("X-data-parallel-rank")) if state.kv else None
            self.ended = lambda: state.count(job, flight, role)  # once, see _end
            try:
                if state.group is not None and state.group.stalled.is_set():
                    state.requests.abort.wait()  # the DP wave waits for a head that is gone
                    raise _Cut("the group's head went away")
                if role != "decode" or self._load(job, engine):
                    self._generate(job, timing, flight, role, engine)
            except _Cut:
                aborted = state.requests.abort.is_set()
                self.close_connection = True
            finally:
                self._end()
                state.requests.done(aborted)

        def _end(self) -> None:
            """Count the request in /metrics, once: as vLLM's engine does, when it has ended,
            before its answer's last bytes go out (a client that has read them sees it)."""
            ended, self.ended = self.ended, None
            if ended is not None:
                ended()

        def _load(self, job: Job, engine: Engine | None) -> bool:
            """A decode's KV load from its prefill (:mod:`vllm.kv_transfer`); False when it
            failed under ``kv_load_failure_policy`` ``fail`` and the failure is answered as
            vLLM answers it. Raises _Cut when the shutdown cuts the wait."""
            assert state.kv is not None and engine is not None and job.kv_transfer_params
            try:
                state.kv.fetch(engine, job.id, job.kv_transfer_params, state.requests.abort)
                return True
            except TransferError:
                if state.requests.abort.is_set():
                    raise _Cut("aborted while loading KV") from None
                if state.kv.policy == "recompute":
                    _log(f"Request {job.id}: KV load failed; recomputing it locally", "WARNING")
                    return True
            _log(f"Request {job.id} failed with an internal error during generation", "ERROR")
            body = error_body(INTERNAL_ERROR, "InternalServerError", 500)
            self._end()
            if not job.stream:
                self._send(500, body)
                return False
            self._open_stream()
            for event in first_events(job, int(time.time())):
                self._event(event)
            self._event(body)
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
            return False

        def _open_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def _generate(
            self, job: Job, timing: Timing, flight: Flight, role: str, engine: Engine | None
        ) -> None:
            """Queue ``job`` until the engine runs it, produce its tokens when ``timing`` has
            them ready (the batch read anew for each; counted in ``flight``) and answer; a
            prefill for a remote decode then holds its KV blocks, and its whole answer names
            them. Raises _Cut when the shutdown aborts it or the client goes away."""
            created = int(time.time())
            if job.stream:  # the headers at once, the first events with the first token (vLLM)
                self._open_stream()
            if not state.requests.schedule(flight):
                raise _Cut("aborted in the queue")
            assert flight.scheduled is not None
            due = flight.scheduled
            for i, token in enumerate(job.tokens()):
                due += timing.delay(i, job.prompt_tokens, state.requests.batch)
                if state.requests.abort.wait(max(0.0, due - time.monotonic())):
                    raise _Cut(f"aborted after {i} tokens")
                state.stats.token(flight, time.monotonic())
                if job.stream and i == 0:
                    for event in first_events(job, created):
                        self._event(event)
                if job.stream:
                    self._event(token_event(job, created, i, token))
            params = None
            if role == "prefill":
                assert state.kv is not None and engine is not None
                params = state.kv.prefill_params(engine, job.id, job.prompt_tokens)
            if not job.stream:
                whole = answer(job, created)
                if params is not None:
                    whole["kv_transfer_params"] = params
                self._end()
                self._send(200, whole)
                return
            for event in last_events(job, created):
                self._event(event)
            self._end()
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")  # the chunked body's end

        def _event(self, event: dict[str, Any]) -> None:
            self._chunk(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")

        def _chunk(self, data: bytes) -> None:
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            except OSError:  # the client went away: vLLM aborts its request
                raise _Cut("client disconnected") from None

    return Handler


def invocation_kind(raw: bytes) -> tuple[str | None, dict[str, Any] | None]:
    """What SageMaker's /invocations runs for body ``raw``: the first request type it validates
    as (a chat: ``messages``; a completion: ``prompt``), else vLLM's 400 (no key is asked)."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        return None, {"detail": f"JSON decode error: {exc}"}
    if isinstance(body, dict) and "messages" in body:
        return "chat", None
    if isinstance(body, dict) and "prompt" in body:
        return "completion", None
    message = (
        "Cannot find suitable handler for request. Expected one of: "
        "['ChatCompletionRequest', 'CompletionRequest']"
    )
    return None, error_body(message)


def scale_answer(raw: bytes) -> tuple[int, dict[str, Any]]:
    """/scale_elastic_ep as vLLM checks its body (no key is asked); the simulated engine does
    not scale, so a good request fails as a failed scale does."""
    try:
        body = json.loads(raw)
    except ValueError:
        return 400, {"detail": "Invalid JSON format"}
    size = body.get("new_data_parallel_size") if isinstance(body, dict) else None
    timeout = body.get("drain_timeout", 120) if isinstance(body, dict) else 120
    if size is None:
        return 400, {"detail": "new_data_parallel_size is required"}
    if not isinstance(size, int) or size <= 0:
        return 400, {"detail": "new_data_parallel_size must be a positive integer"}
    if not isinstance(timeout, int) or timeout <= 0:
        return 400, {"detail": "drain_timeout must be a positive integer"}
    _log("Scale failed: the simulated engine does not scale", "ERROR")
    return 500, {"detail": "Scale failed"}


def _metrics(state: _State) -> str:
    """The text exposition: vLLM's metrics as its PrometheusStatLogger labels them (the served
    model's name, the engine index ``0``: :mod:`vllm.serving_metrics`), then the simulation's
    own."""
    out = state.stats.lines(state.names[0], *state.requests.load())
    label = f'model_name="{state.names[0]}"'
    group = state.group
    for name, kind, value in (
        ("vllm_sim:compiled_at_start", "gauge", int(state.info["compiled"])),
        ("servefleet_sim_kv_leases", "gauge", state.kv.blocks.count() if state.kv else 0),
        ("servefleet_sim_group_size", "gauge", group.size if group else 1),
        ("servefleet_sim_group_ranks", "gauge", group.alive if group else 1),
    ):
        out += [f"# TYPE {name} {kind}", f"{name}{{{label}}} {value}"]
    out.append("# TYPE servefleet_sim_requests_total counter")
    for role, count in state.roles.items():
        out.append(f'servefleet_sim_requests_total{{{label},role="{role}"}} {count}')
    return "\n".join(out) + "\n"
