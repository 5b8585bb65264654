"""The servers' path guard (#46 item 1: ``remote/asgi/servefleet_paths.py``), as vLLM runs it:
an ASGI app around vLLM's, the one it passes a request on to. Against the real vLLM app and its
key check: tests/realvllm/test_trusted.py; on the lab: tests/hosts/test_exposure.py."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from typing import Any

import pytest

from servefleet.base.remote import REMOTE, layout


def load() -> Any:
    spec = importlib.util.spec_from_file_location(
        "guard_under_test", REMOTE / layout.ASGI / f"{layout.PATH_GUARD_MODULE}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ask(guard: Any, path: str, kind: str = "http", root_path: str = "") -> tuple[Any, bool]:
    """(what the guard sent, or None; whether it passed the request on)."""
    passed, sent = [], []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        passed.append(scope)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {"type": kind, "path": path, "root_path": root_path, "method": "POST"}
    asyncio.run(guard(app)(scope, receive, send))
    return (sent or None), bool(passed)


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(layout.OPEN_PATHS_VAR, "/v1/ /health /metrics")
    module = load()
    assert module.OPEN_PATHS_VAR == layout.OPEN_PATHS_VAR
    return module.OpenPaths


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/health", "/metrics"])
def test_an_open_path_goes_on_to_vllm(guard: Any, path: str) -> None:
    assert ask(guard, path) == (None, True)


@pytest.mark.parametrize(
    "path",
    ["/invocations", "/scale_elastic_ep", "/tokenize", "/generative_scoring", "/docs", "/v1",
     "/health/", "/healthz", "/metrics/x", "/V1/models", ""],
)  # fmt: skip
def test_any_other_path_is_404_before_vllm_sees_it(guard: Any, path: str) -> None:
    sent, passed = ask(guard, path)
    assert not passed
    start, body = sent
    assert (start["type"], start["status"]) == ("http.response.start", 404)
    assert dict(start["headers"])[b"content-type"] == b"application/json"
    assert int(dict(start["headers"])[b"content-length"]) == len(body["body"])
    assert json.loads(body["body"]) == {"detail": "Not Found"}  # FastAPI's


def test_the_path_is_taken_without_the_apps_root_path_as_vllm_routes_it(guard: Any) -> None:
    assert ask(guard, "/api/v1/models", root_path="/api") == (None, True)
    assert not ask(guard, "/api/invocations", root_path="/api")[1]


def test_a_websocket_to_another_path_is_closed_unaccepted(guard: Any) -> None:
    sent, passed = ask(guard, "/v2/realtime", kind="websocket")
    assert not passed and sent == [{"type": "websocket.close", "code": 1008}]
    assert ask(guard, "/v1/realtime", kind="websocket") == (None, True)


def test_the_lifespan_passes(guard: Any) -> None:
    assert ask(guard, "", kind="lifespan") == (None, True)


def test_without_its_paths_the_guard_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(layout.OPEN_PATHS_VAR, raising=False)
    with pytest.raises(RuntimeError, match="SERVEFLEET_OPEN_PATHS is not set"):
        load().OpenPaths(lambda *a: None)


def test_an_empty_list_opens_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(layout.OPEN_PATHS_VAR, "")
    assert not ask(load().OpenPaths, "/v1/models")[1]
