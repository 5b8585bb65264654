"""The simulated ``vllm serve`` runs ``--middleware`` as vLLM 0.30.0 does (#46 item 1): the
class imported when the app is built, outermost, before the API key; here with servefleet's own
path guard (``base/remote/asgi/servefleet_paths.py``). Without it, vLLM's unkeyed routes run
inference and take an engine change with an API key set: the hole the guard closes. Runs the
simulator on this machine (sim_fixtures.py's venv), waits with deadlines."""

from __future__ import annotations

import importlib
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from lab_sim_support import Server, free_port, request
from sim_fixtures import MODEL

from servefleet.base.remote import REMOTE, layout

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me more"}], "max_tokens": 2}
KEY = "Bearer k1"


def start(venv: Path, env: dict[str, str], *args: str, ready: bool = True) -> Server:
    port = free_port()
    cmd = [str(venv / "bin/vllm"), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    server = Server([*cmd, "--api-key", "k1", *args], env, port)
    if ready:
        server.wait_ready(path="/health")
    return server


def guarded_env(env: dict[str, str], paths: str = "/v1/ /health /metrics") -> dict[str, str]:
    return dict(env, PYTHONPATH=str(REMOTE / layout.ASGI), **{layout.OPEN_PATHS_VAR: paths})


def test_without_the_guard_vllms_unkeyed_routes_answer_without_the_key(
    venv: Path, sim_env: dict[str, str]
) -> None:
    server = start(venv, sim_env)
    port = server.port
    try:
        assert request(port, "POST", "/v1/chat/completions", CHAT)[0] == 401
        status, raw = request(port, "POST", "/invocations", CHAT)  # no key: inference all the same
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 2
        status, raw = request(port, "POST", "/invocations", {"prompt": "a b", "model": MODEL,
                                                             "max_tokens": 1})  # fmt: skip
        assert status == 200 and json.loads(raw)["object"] == "text_completion"
        assert request(port, "POST", "/invocations", {"x": 1})[0] == 400
        assert request(port, "POST", "/scale_elastic_ep", {}) == (
            400, b'{"detail": "new_data_parallel_size is required"}')  # fmt: skip
        assert request(port, "POST", "/scale_elastic_ep", {"new_data_parallel_size": 2})[0] == 500
    finally:
        assert server.stop()[0] == 0


def test_the_path_guard_answers_404_off_its_paths_before_the_key(
    venv: Path, sim_env: dict[str, str]
) -> None:
    server = start(venv, guarded_env(sim_env), "--middleware", layout.PATH_GUARD)
    port = server.port
    try:
        for path in ("/invocations", "/scale_elastic_ep", "/tokenize", "/v1"):
            assert request(port, "POST", path, CHAT) == (404, b'{"detail":"Not Found"}'), path
        assert request(port, "GET", "/version") == (404, b'{"detail":"Not Found"}')
        assert request(port, "GET", "/v1/models")[0] == 401  # the key still guards /v1
        assert request(port, "GET", "/v1/models", key=KEY)[0] == 200
        assert request(port, "POST", "/v1/chat/completions", CHAT, key=KEY)[0] == 200
        for path in ("/health", "/metrics"):
            assert request(port, "GET", path)[0] == 200, path
    finally:
        assert server.stop()[0] == 0


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("nope.Guard", "ModuleNotFoundError: No module named 'nope'"),
        ("servefleet_paths.Missing", "AttributeError: module 'servefleet_paths' has no attribute"),
        ("servefleet_paths.OPEN_PATHS_VAR", "ValueError: Invalid middleware servefleet_paths."
                                            "OPEN_PATHS_VAR. Must be a function or a class."),
    ],
)  # fmt: skip
def test_a_middleware_that_does_not_load_fails_the_start(
    venv: Path, sim_env: dict[str, str], name: str, line: str
) -> None:
    server = start(venv, guarded_env(sim_env), "--middleware", name, ready=False)
    code, err = server.proc.wait(60), server.stop()[1]
    assert code == 1 and line in err, err


def first_answer(server: Server, path: str, timeout: float = 30) -> int:
    """The status of the first answer to GET ``path`` (the server is up but not healthy)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.stop()[1]
        try:
            return request(server.port, "GET", path)[0]
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"no answer to {path}")


def test_a_guard_without_its_paths_answers_every_request_500(
    venv: Path, sim_env: dict[str, str]
) -> None:
    env = guarded_env(sim_env)
    del env[layout.OPEN_PATHS_VAR]
    server = start(venv, env, "--middleware", layout.PATH_GUARD, ready=False)
    try:
        assert first_answer(server, "/health") == 500  # Starlette never builds its stack
        assert request(server.port, "POST", "/invocations", CHAT)[0] == 500
    finally:
        server.stop()


def test_the_last_middleware_named_is_outermost(sim: Any) -> None:
    """As Starlette's add_middleware: the last named sees the request first."""
    mw = importlib.import_module(sim.__name__.rsplit(".", 1)[0] + ".middleware")
    seen: list[str] = []
    module = types.ModuleType("order_under_test")
    for tag in ("First", "Second"):

        def init(self: Any, app: Any) -> None:
            self.app = app

        async def call(self: Any, scope: Any, receive: Any, send: Any, tag: str = tag) -> None:
            seen.append(tag)
            await self.app(scope, receive, send)

        setattr(module, tag, type(tag, (), {"__init__": init, "__call__": call}))
    sys.modules[module.__name__] = module
    try:
        stack = mw.Stack(["order_under_test.First", "order_under_test.Second"])
        assert stack.answer("GET", "/x", [], b"", ("127.0.0.1", 1), ("127.0.0.1", 2)) is None
    finally:
        del sys.modules[module.__name__]
    assert seen == ["Second", "First"]
    assert mw.Stack([]).answer("GET", "/x", [], b"", ("a", 1), ("b", 2)) is None
