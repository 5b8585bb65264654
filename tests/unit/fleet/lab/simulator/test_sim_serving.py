"""The simulated ``vllm serve`` serving (src/servefleet/fleet/lab/simulator/packages/vllm/): replies at
the lab's token rate, whole and streamed as vLLM streams them; vLLM 0.30's shutdown
(``--shutdown-timeout``: drain, abort, no new requests); the API key as vLLM enforces it. Runs on
this machine as test_lab_sim.py does (sim_fixtures.py's fixtures): every simulation path under
$RBLN_SIM_ROOT. Waits on conditions with deadlines, never on fixed sleeps."""

from __future__ import annotations

import contextlib
import importlib
import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http import client as httpc
from pathlib import Path
from typing import Any

import pytest
from lab_sim_support import Server, Stream, free_port, http, read_stream, request, wait_for
from sim_fixtures import MODEL, serve, vllm

RATE = 40.0  # tokens per second in these tests: 80 tokens take 2 s
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me more"}]}


@pytest.fixture
def rate(simroot: Path) -> Iterator[Path]:
    """The lab's token rate file, at RATE; removed afterwards (the default is fast again)."""
    path = simroot / "etc/rbln-sim/tokens-per-second"
    path.write_text(f"{RATE:g}\n")
    yield path
    path.unlink(missing_ok=True)


def in_background(fn: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def running(port: int) -> int:
    """vllm:num_requests_running on /metrics."""
    metrics = http(port, "/metrics")[1].decode()
    line = next(x for x in metrics.splitlines() if x.startswith("vllm:num_requests_running{"))
    return int(float(line.rsplit(" ", 1)[1]))


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


# ---------------------------------------------------------------------------------------------
# Token timing and streaming


def test_replies_take_the_rate_and_stream_as_vllm(
    venv: Path, sim_env: dict[str, str], rate: Path
) -> None:
    server = serve(venv, sim_env)
    try:
        start = time.monotonic()
        status, body = request(
            server.port, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=20)
        )
        took = time.monotonic() - start
        whole = json.loads(body)
        assert status == 200 and took >= 20 / RATE, (took, body)  # 0.5 s: every token took its time
        text = whole["choices"][0]["message"]["content"]
        assert len(text.split()) == 20 and whole["choices"][0]["finish_reason"] == "length"
        assert whole["usage"]["completion_tokens"] == 20

        start = time.monotonic()
        body = dict(CHAT, max_tokens=20, stream_options={"include_usage": True})
        got = read_stream(server.port, "/v1/chat/completions", body, Stream())
        took = time.monotonic() - start
        assert took >= 20 / RATE, took
        assert got.status == 200 and got.done and not got.cut, got
        first, *tokens, usage = got.events
        assert first["object"] == "chat.completion.chunk" and first["id"].startswith("chatcmpl-")
        assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}]  # fmt: skip
        assert len(tokens) == 20 and "".join(got.tokens()) == text
        assert [t["choices"][0]["finish_reason"] for t in tokens] == [None] * 19 + ["length"]
        assert all(t["model"] == MODEL and t["id"] == first["id"] for t in got.events)
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 20

        # /v1/completions: whole and streamed, the same words
        prompt = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8}
        status, body = request(server.port, "POST", "/v1/completions", prompt)
        whole = json.loads(body)
        assert status == 200 and whole["object"] == "text_completion"
        assert whole["usage"] == {"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12}
        got = read_stream(server.port, "/v1/completions", prompt, Stream())
        assert (
            got.done
            and len(got.events) == 8
            and all(e["object"] == "text_completion" for e in got.events)
        )
        assert "".join(got.tokens()) == whole["choices"][0]["text"]
        assert got.events[-1]["choices"][0]["finish_reason"] == "length"
        assert (
            f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}} 4.0'
            in http(server.port, "/metrics")[1].decode()
        )
    finally:
        assert server.stop()[0] == 0


def test_refuses_bad_requests_as_vllm(venv: Path, sim_env: dict[str, str]) -> None:
    server = serve(venv, sim_env, "--max-model-len", "64")
    chat = "/v1/chat/completions"
    try:
        for body, code, message in [
            (dict(CHAT, max_tokens=0), 400, "max_tokens must be at least 1, got 0."),
            (dict(CHAT, max_tokens="5"), 400, "max_tokens must be an integer, got '5'."),
            (dict(CHAT, stream_options={"include_usage": True}), 400,
             "Stream options can only be defined when `stream=True`."),
            (dict(CHAT, max_tokens=100), 400, "maximum context length is 64 tokens"),
            (dict(CHAT, model="other"), 404, "The model `other` does not exist."),
        ]:  # fmt: skip
            status, raw = request(server.port, "POST", chat, body)
            assert status == code and message in json.loads(raw)["error"]["message"], raw
        status, raw = request(server.port, "POST", "/v1/completions", {"model": MODEL})
        assert status == 400 and "prompt must be a string" in json.loads(raw)["error"]["message"]
        assert request(server.port, "POST", "/v1/embeddings", {})[0] == 404
    finally:
        assert server.stop()[0] == 0


def test_rate_file_is_checked(venv: Path, simroot: Path, sim_env: dict[str, str]) -> None:
    path = simroot / "etc/rbln-sim/tokens-per-second"
    try:
        path.write_text("fast\n")
        proc = vllm(venv / "bin/python", MODEL, env=sim_env)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert f"{path} holds 'fast'; expected a number of tokens per second > 0" in proc.stderr
        path.unlink()
        server = serve(venv, sim_env)
        try:  # read for every request: a bad value fails the request, in one line
            path.write_text("0\n")
            status, raw = request(server.port, "POST", "/v1/chat/completions", CHAT)
            assert status == 500 and "holds '0'" in json.loads(raw)["error"]["message"]
            path.write_text("1e6\n")
            assert request(server.port, "POST", "/v1/chat/completions", CHAT)[0] == 200
        finally:
            assert server.stop()[0] == 0
    finally:
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# SIGTERM: vLLM 0.30's --shutdown-timeout


def _stream_in_background(port: int, tokens: int) -> tuple[Stream, threading.Thread]:
    got = Stream()
    body = dict(CHAT, max_tokens=tokens)
    thread = in_background(lambda: read_stream(port, "/v1/chat/completions", body, got))
    assert got.first.wait(10) and got.tokens(), "the stream did not start"
    return got, thread


def test_sigterm_drains_the_requests_in_flight(
    venv: Path, sim_env: dict[str, str], rate: Path
) -> None:
    """A 2 s stream running when SIGTERM arrives completes with every token when
    --shutdown-timeout covers it; meanwhile nothing new is served; then the server exits."""
    server = serve(venv, sim_env, "--shutdown-timeout", "30")
    port = server.port
    got, thread = _stream_in_background(port, 80)
    server.proc.send_signal(signal.SIGTERM)
    wait_for("the drain", lambda: http(port, "/health")[0] == 503)
    status, raw = request(port, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=1))
    assert status == 503 and "shutting down" in json.loads(raw)["error"]["message"]
    assert server.proc.poll() is None and not got.done  # still streaming
    thread.join(30)
    assert got.done and not got.cut and len(got.tokens()) == 80
    assert got.events[-1]["choices"][0]["finish_reason"] == "length"
    code, err = server.stop()
    assert code == 0 and refused(port)
    assert "stopping engine client mode=drain timeout=30s" in err
    assert "(1 requests in flight at the signal, 0 aborted)" in err


def test_sigterm_aborts_with_timeout_zero(venv: Path, sim_env: dict[str, str], rate: Path) -> None:
    """vLLM's default, --shutdown-timeout 0: the requests in flight are cut at once, a stream
    without [DONE], a whole answer never sent (both running: --max-num-seqs 2, not vllm-rbln's
    default 1)."""
    server = serve(venv, sim_env, "--max-num-seqs", "2")
    port = server.port
    whole: dict[str, Any] = {}

    def ask() -> None:
        try:
            whole["answer"] = request(
                port, "POST", "/v1/chat/completions", dict(CHAT, max_tokens=80)
            )
        except (httpc.HTTPException, ConnectionError) as exc:
            whole["error"] = exc

    asker = in_background(ask)
    got, streamer = _stream_in_background(port, 80)
    wait_for("both requests in flight", lambda: running(port) == 2)
    server.proc.send_signal(signal.SIGTERM)
    streamer.join(10)
    asker.join(10)
    assert got.cut and not got.done and 0 < len(got.tokens()) < 80
    assert isinstance(whole.get("error"), httpc.RemoteDisconnected), whole
    code, err = server.stop()
    assert code == 0
    assert "stopping engine client mode=abort timeout=0s" in err
    assert "(2 requests in flight at the signal, 2 aborted)" in err


def test_drain_ends_at_the_timeout(venv: Path, sim_env: dict[str, str], rate: Path) -> None:
    """A stream longer than --shutdown-timeout runs until the timeout, then is cut."""
    server = serve(venv, sim_env, "--shutdown-timeout", "1")
    got, thread = _stream_in_background(server.port, 400)  # 10 s
    before = len(got.tokens())
    signalled = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    thread.join(30)
    code, err = server.stop()
    elapsed = time.monotonic() - signalled
    assert got.cut and not got.done and before < len(got.tokens()) < 400
    assert code == 0 and 1 <= elapsed < 9
    assert "(1 requests in flight at the signal, 1 aborted)" in err


def test_idle_server_exits_at_once(venv: Path, sim_env: dict[str, str]) -> None:
    """Nothing in flight: a long --shutdown-timeout costs nothing; a second signal changes
    nothing."""
    server = serve(venv, sim_env, "--shutdown-timeout", "600")
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(ProcessLookupError):
        server.proc.send_signal(signal.SIGINT)
    code, err = server.stop()
    assert code == 0 and time.monotonic() - start < 5 and refused(server.port)
    assert err.count("shutdown triggered") == 1 and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# The API key


def _serve_guarded(venv: Path, env: dict[str, str], *args: str) -> Server:
    port = free_port()
    cmd = [str(venv / "bin/vllm"), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    server = Server([*cmd, *args], env, port)
    server.wait_ready(path="/health")  # /v1 answers 401 without the key
    return server


def test_api_key_guards_v1_as_vllm(venv: Path, sim_env: dict[str, str]) -> None:
    server = _serve_guarded(venv, dict(sim_env, VLLM_API_KEY="from-env"), "--api-key", "k1", "k2")
    port = server.port
    try:
        assert request(port, "GET", "/v1/models") == (401, b'{"error": "Unauthorized"}')
        for header in ("Bearer wrong", "Basic k1", "Bearer", "k1", "Bearer from-env"):
            assert request(port, "GET", "/v1/models", key=header)[0] == 401, header
        for header in ("Bearer k1", "bearer k2", "BEARER k1"):
            assert request(port, "GET", "/v1/models", key=header)[0] == 200, header
        chat = dict(CHAT, max_tokens=2)
        assert request(port, "POST", "/v1/chat/completions", chat)[0] == 401
        assert request(port, "POST", "/v1/completions", {"prompt": "x"})[0] == 401
        status, raw = request(port, "POST", "/v1/chat/completions", chat, key="Bearer k2")
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 2
        assert request(port, "GET", "/v1/nothing-here")[0] == 401  # the guard comes first
        for path in ("/health", "/metrics", "/version"):  # open without a key
            assert request(port, "GET", path)[0] == 200, path
    finally:
        assert server.stop()[0] == 0


def test_api_key_from_the_environment(venv: Path, sim_env: dict[str, str]) -> None:
    server = _serve_guarded(venv, dict(sim_env, VLLM_API_KEY="from-env"))
    try:
        assert request(server.port, "GET", "/v1/models")[0] == 401
        assert request(server.port, "GET", "/v1/models", key="Bearer from-env")[0] == 200
    finally:
        assert server.stop()[0] == 0
    server = serve(venv, dict(sim_env, VLLM_API_KEY=""))  # an empty key: no guard
    try:
        assert request(server.port, "GET", "/v1/models")[0] == 200
    finally:
        assert server.stop()[0] == 0


def test_api_key_rule(sim: Any) -> None:
    """The middleware's rule without a server: keys from the flag, else the environment."""
    api = importlib.import_module(sim.__name__.rsplit(".", 1)[0] + ".http_api")
    ns = sim.parse_serve_args([MODEL, "--api-key", "a", ""], "rbln")
    hashes = api.api_key_hashes(ns, {"VLLM_API_KEY": "env"})
    assert len(hashes) == 1 and api.authorized(hashes, "Bearer a")
    assert not api.authorized(hashes, "Bearer env") and not api.authorized(hashes, None)
    assert not api.authorized(hashes, "Bearer a ")  # the whole rest is the key
    ns = sim.parse_serve_args([MODEL], "rbln")
    assert api.api_key_hashes(ns, {"VLLM_API_KEY": ""}) == []
    assert len(api.api_key_hashes(ns, {"VLLM_API_KEY": "e"})) == 1
