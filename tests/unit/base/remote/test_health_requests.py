"""The gate's requests, ``remote/health.py`` in-process (issue #37's mutation campaign): what
``probe`` and ``pd_probe`` send (the readiness path, the one-token chat, the prefill's
``kv_transfer_params`` and the decode's, the key as a Bearer header, each request's timeout) and
how each answer reads (``_why``: a 401 with or without a key, another status, a reply without
choices, one too large, not JSON, a refused connection). The server is the test's: an opener
that records each request and answers from a script, and one real HTTP stub in a thread."""

from __future__ import annotations

import io
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from email.message import Message
from typing import Any

import pytest
from fake_host import Stub
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import health  # noqa: E402  (a host program: imported as the host imports it)

BASE = "http://10.0.0.1:8000"
OK = {"choices": [{"message": {"content": "p"}}]}


class Reply(io.BytesIO):
    def __init__(self, body: bytes, status: int = 200) -> None:
        super().__init__(body)
        self.status = status
        self.reads: list[int] = []

    def read(self, size: int | None = -1) -> bytes:
        self.reads.append(-1 if size is None else size)
        return super().read(size)


class Opener:
    """Each request kept as (url, timeout, headers, body); answers popped from ``script`` (a
    Reply, or an exception raised)."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.sent: list[tuple[str, float, dict[str, str], Any]] = []

    def open(self, req: Any, timeout: float) -> Reply:
        if isinstance(req, urllib.request.Request):
            body = json.loads(req.data) if req.data else None  # type: ignore[arg-type]
            self.sent.append((req.full_url, timeout, dict(req.header_items()), body))
        else:
            self.sent.append((req, timeout, {}, None))
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]


def chat(reply: Any = OK) -> Reply:
    return Reply(json.dumps(reply).encode())


def http_error(url: str, code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(url, code, "x", Message(), None)


@pytest.fixture
def opener(monkeypatch: pytest.MonkeyPatch) -> Opener:
    fake = Opener()
    monkeypatch.setattr(health, "_OPENER", fake)
    return fake


def test_a_healthy_probe_asks_health_then_one_token(opener: Opener) -> None:
    opener.script += [Reply(b""), chat()]
    assert health.probe(BASE, "acme/m", 60.0, "sk-1") is None
    assert opener.sent == [
        (f"{BASE}/health", 5.0, {}, None),
        (f"{BASE}/v1/chat/completions", 30.0,
         {"Content-type": "application/json", "Authorization": "Bearer sk-1"},
         {"model": "acme/m", "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}),
    ]  # fmt: skip


def test_short_limits_and_another_path(opener: Opener) -> None:
    first, second = Reply(b""), chat()
    opener.script += [first, second]
    assert health.probe(BASE, "m", 2.0, None, path="/readiness") is None
    assert [(url, limit) for url, limit, _, _ in opener.sent] == [
        (f"{BASE}/readiness", 2.0), (f"{BASE}/v1/chat/completions", 2.0)
    ]  # fmt: skip
    assert opener.sent[1][2] == {"Content-type": "application/json"}  # no key: no header
    assert second.reads == [health.MAX_REPLY + 1]


# each answer made afresh for each run (a reply read once is closed)
ANSWERS: dict[str, tuple[Callable[[], list[Any]], str]] = {
    "204": (lambda: [Reply(b"", 204)], "/health answered 204"),
    "503": (lambda: [http_error(f"{BASE}/health", 503)], f"{BASE}/health answered 503"),
    "401": (lambda: [Reply(b""), http_error(f"{BASE}/v1/chat/completions", 401)],
            f"{BASE}/v1/chat/completions answered 401 Unauthorized with the unit's API key"),
    "no-choices": (lambda: [Reply(b""), chat({"choices": []})], "chat completion had no choices"),
    "a-list": (lambda: [Reply(b""), chat([1])], "chat completion had no choices"),
    "no-choices-key": (lambda: [Reply(b""), chat({"id": 1})], "chat completion had no choices"),
    "too-large": (lambda: [Reply(b""), Reply(b"x" * (health.MAX_REPLY + 1))],
                  f"chat completion reply is larger than {health.MAX_REPLY} bytes"),
    "not-json": (lambda: [Reply(b""), Reply(b"not json")],
                 "not answering: Expecting value: line 1 column 1 (char 0)"),
    "refused": (lambda: [ConnectionRefusedError(111, "Connection refused")],
                "not answering: [Errno 111] Connection refused"),
}  # fmt: skip


@pytest.mark.parametrize("case", ANSWERS)
def test_each_answer_reads_as(opener: Opener, case: str) -> None:
    answers, why = ANSWERS[case]
    opener.script += answers()
    assert health.probe(BASE, "m", 60.0, "k") == why


def test_a_reply_at_the_limit_is_read(opener: Opener) -> None:
    body = json.dumps(OK).encode()
    opener.script += [Reply(b""), Reply(body + b" " * (health.MAX_REPLY - len(body)))]
    assert health.probe(BASE, "m", 60.0) is None


def test_a_401_without_a_key_says_the_unit_has_none(opener: Opener) -> None:
    opener.script += [Reply(b""), http_error(f"{BASE}/v1/chat/completions", 401)]
    assert health.probe(BASE, "m", 60.0) == (
        f"{BASE}/v1/chat/completions answered 401 Unauthorized without an API key (the unit has "
        "none)"
    )
    assert health.UNAUTHORIZED == "answered 401 Unauthorized"


# -- pd_probe --------------------------------------------------------------------------------------

PREFILL, DECODE = "http://10.0.0.1:8001", "http://10.0.0.2:8002"
KV = {"remote_engine_id": "e1", "remote_block_ids": [1, 2]}


def test_a_request_goes_through_the_prefill_then_the_decode(opener: Opener) -> None:
    opener.script += [chat({**OK, "kv_transfer_params": KV}), chat()]
    assert health.pd_probe(PREFILL, DECODE, "acme/m", 7.0, "sk-2") is None
    ping = [{"role": "user", "content": "ping"}]
    headers = {"Content-type": "application/json", "Authorization": "Bearer sk-2"}
    assert opener.sent == [
        (f"{PREFILL}/v1/chat/completions", 7.0, headers,
         {"model": "acme/m", "messages": ping, "max_tokens": 1, "kv_transfer_params": {
             "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
             "remote_block_ids": None, "remote_host": None, "remote_port": None}}),
        (f"{DECODE}/v1/chat/completions", 7.0, headers,
         {"model": "acme/m", "messages": ping, "max_tokens": 1, "kv_transfer_params": KV}),
    ]  # fmt: skip


def test_each_pd_failure_names_its_server(opener: Opener) -> None:
    opener.script += [http_error(f"{PREFILL}/v1/chat/completions", 500)]
    assert health.pd_probe(PREFILL, DECODE, "m", 7.0) == (
        f"prefill {PREFILL}: {PREFILL}/v1/chat/completions answered 500"
    )
    opener.script += [chat({"choices": []})]
    assert health.pd_probe(PREFILL, DECODE, "m", 7.0) == (
        f"prefill {PREFILL}: chat completion had no choices"
    )
    for kv in (None, "x", [1]):
        opener.script += [chat({**OK, "kv_transfer_params": kv})]
        assert health.pd_probe(PREFILL, DECODE, "m", 7.0) == (
            f"prefill {PREFILL}: its answer carries no kv_transfer_params"
        )
    opener.script += [chat({**OK, "kv_transfer_params": {}}), ConnectionResetError(104, "reset")]
    assert health.pd_probe(PREFILL, DECODE, "m", 7.0, "k") == (
        f"decode {DECODE} after prefill {PREFILL}: not answering: [Errno 104] reset"
    )
    opener.script += [chat({**OK, "kv_transfer_params": KV}), chat({"choices": None})]
    assert health.pd_probe(PREFILL, DECODE, "m", 7.0) == (
        f"decode {DECODE} after prefill {PREFILL}: chat completion had no choices"
    )
    opener.script += [Reply(b"[]")]
    assert health.pd_probe(PREFILL, DECODE, "m", 7.0) == (
        f"prefill {PREFILL}: chat completion had no choices"
    )
    assert opener.script == []


def test_a_pd_401_says_whether_a_key_was_sent(opener: Opener) -> None:
    opener.script += [http_error(f"{PREFILL}/v1/chat/completions", 401)]
    assert health.pd_probe(PREFILL, DECODE, "m", 7.0, "k") == (
        f"prefill {PREFILL}: {PREFILL}/v1/chat/completions answered 401 Unauthorized with the "
        "unit's API key"
    )
    opener.script += [chat({**OK, "kv_transfer_params": KV}),
                      http_error(f"{DECODE}/v1/chat/completions", 401)]  # fmt: skip
    assert health.pd_probe(PREFILL, DECODE, "m", 7.0, "k") == (
        f"decode {DECODE} after prefill {PREFILL}: {DECODE}/v1/chat/completions answered 401 "
        "Unauthorized with the unit's API key"
    )


def test_probe_against_a_real_server() -> None:
    with Stub(api_key="sk-3") as stub:
        base = f"http://127.0.0.1:{stub.port}"
        assert health.probe(base, "m", 5.0, "sk-3") is None
        assert stub.auth == [None, "Bearer sk-3"]
        assert stub.requests[1] == ("/v1/chat/completions",
                                    {"model": "m", "max_tokens": 1, "messages": health.PING})  # fmt: skip
