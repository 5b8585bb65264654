"""src/servefleet/base/remote/http_client.py in-process (#37), against stub servers on 127.0.0.1
and 127.0.0.2: what an origin is (scheme, host, port: lowercased, the port by scheme, -1 for one
that is not a number), a redirect keeping the Authorization header within its origin only (the
handler asked directly, for each part of an origin, and through a real redirect), and the
client's reads and downloads: its bearer token, the body's limit (at it and one over), a
download written from its start on each try with its sha256, and each failure's one line (404,
401 and 403 with and without the token's variable, another status, a status tried again, no
answer in time, a scheme nothing serves)."""

from __future__ import annotations

import errno
import hashlib
import http.client
import io
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from fetch_stubs import TOKEN, Stub, in_turn, respond
from repo_paths import REMOTE

sys.path.insert(0, str(REMOTE))
import http_client  # noqa: E402
import refusal  # noqa: E402

NOT_FOUND = "the model is not in the store"


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub("127.0.0.1")
    yield server
    server.close()


@pytest.fixture
def other() -> Iterator[Stub]:
    """Another host (127.0.0.2, same loopback)."""
    server = Stub("127.0.0.2")
    yield server
    server.close()


def client(
    token: str | None = None, token_env: str | None = None, tries: int = 1
) -> http_client.Client:
    return http_client.Client(token, token_env, 5.0, tries, 0.0)


def refusal_of(call: object) -> refusal.Refusal:
    """The Refusal a zero-argument call raises."""
    with pytest.raises(refusal.Refusal) as got:
        call()  # type: ignore[operator]
    return got.value


# --- origins -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("http://example.com/x", ("http", "example.com", 80)),
        ("HTTP://Example.COM/x", ("http", "example.com", 80)),
        ("https://h.invalid/x", ("https", "h.invalid", 443)),
        ("HTTPS://h.invalid/x", ("https", "h.invalid", 443)),
        ("http://h.invalid:8080/x", ("http", "h.invalid", 8080)),
        ("https://h.invalid:80/x", ("https", "h.invalid", 80)),
        ("http://h.invalid:port/x", ("http", "h.invalid", -1)),
        ("ftp://h.invalid/x", ("ftp", "h.invalid", None)),
        ("/relative", ("", "", None)),
    ],
)
def test_the_origin_of_a_url(url: str, want: tuple[str, str, int | None]) -> None:
    assert http_client.origin(url) == want


# --- redirects -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("new", "kept"),
    [
        ("http://store.invalid/blobs/a", True),
        ("HTTP://STORE.invalid:80/blobs/a", True),
        ("https://store.invalid/blobs/a", False),
        ("http://store.invalid:8080/blobs/a", False),
        ("http://blobs.invalid/a", False),
    ],
)
def test_a_redirect_keeps_the_token_within_its_origin_only(new: str, kept: bool) -> None:
    req = urllib.request.Request("http://store.invalid/m.tar.gz")
    req.add_header("Authorization", f"Bearer {TOKEN}")
    req.add_header("Accept", "*/*")
    headers = http.client.HTTPMessage()
    redirected = http_client.Redirects().redirect_request(
        req, io.BytesIO(b""), 302, "Found", headers, new
    )
    assert redirected is not None and redirected.full_url == new
    assert redirected.has_header("Authorization") is kept
    assert redirected.get_header("Accept") == "*/*"


def test_a_redirect_urllib_does_not_follow_is_the_answer_as_it_came() -> None:
    """A 307 of a POST is not followed: the error is the server's status, words, headers and
    body as they came."""
    req = urllib.request.Request("http://store.invalid/m", data=b"x")
    headers, body = http.client.HTTPMessage(), io.BytesIO(b"moved")
    with pytest.raises(urllib.error.HTTPError) as got:
        http_client.Redirects().redirect_request(
            req, body, 307, "Temporary Redirect", headers, "http://store.invalid/n"
        )
    assert (got.value.code, got.value.msg) == (307, "Temporary Redirect")
    assert got.value.hdrs is headers and got.value.fp is body


@pytest.mark.parametrize("where", ["same origin", "other host"])
def test_a_real_redirect_carries_the_token_only_within_the_origin(
    where: str, stub: Stub, other: Stub
) -> None:
    target = stub if where == "same origin" else other
    target.routes["/blob"] = respond(200, b"the body")
    stub.routes["/store/m"] = respond(302, headers={"Location": f"{target.url}/blob"})
    got = client(TOKEN).read(f"{stub.url}/store/m", NOT_FOUND, 100)
    assert got == b"the body"
    sent = [h.get("authorization") for path, h in target.seen if path == "/blob"]
    assert sent == [f"Bearer {TOKEN}" if where == "same origin" else None]


# --- reads and downloads -------------------------------------------------------------------------
def test_a_read_sends_the_token_and_no_header_without_one(stub: Stub) -> None:
    stub.routes["/m"] = respond(200, b"{}")
    assert client(TOKEN).read(f"{stub.url}/m", NOT_FOUND, 10) == b"{}"
    assert client().read(f"{stub.url}/m", NOT_FOUND, 10) == b"{}"
    assert [h.get("authorization") for _, h in stub.seen] == [f"Bearer {TOKEN}", None]


def test_a_read_takes_its_limit_and_refuses_one_byte_more(stub: Stub) -> None:
    stub.routes["/m"] = respond(200, b"x" * 10)
    assert client().read(f"{stub.url}/m", NOT_FOUND, 10) == b"x" * 10
    got = refusal_of(lambda: client().read(f"{stub.url}/m", NOT_FOUND, 9))
    assert (str(got), got.code) == (f"{stub.url}/m is larger than 9 bytes", 1)


def cut_short(body: bytes) -> object:
    """200 with body's Content-Length, half of it sent, the connection closed."""

    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body[: len(body) // 2])
        handler.wfile.flush()
        handler.close_connection = True

    return route


def test_a_read_cut_short_is_tried_again(stub: Stub) -> None:
    stub.routes["/m"] = in_turn(cut_short(b"0123456789"), respond(200, b"0123456789"))  # type: ignore[arg-type]
    assert client(tries=2).read(f"{stub.url}/m", NOT_FOUND, 100) == b"0123456789"
    assert stub.paths() == ["/m", "/m"]


def test_a_download_starts_over_on_each_try_and_gives_its_sha256(
    stub: Stub, tmp_path: Path
) -> None:
    body = bytes(range(256)) * (3 * 4096 + 7)  # over two chunks of a MiB
    stub.routes["/a"] = in_turn(cut_short(body), respond(200, body))  # type: ignore[arg-type]
    with open(tmp_path / "a", "w+b") as out:
        out.write(b"left from before")
        sha = client(TOKEN, tries=2).download(f"{stub.url}/a", out, NOT_FOUND)
    assert sha == hashlib.sha256(body).hexdigest()
    assert (tmp_path / "a").read_bytes() == body
    assert [h.get("authorization") for _, h in stub.seen] == [f"Bearer {TOKEN}"] * 2


def test_a_download_cut_short_every_time_could_not_be_reached(stub: Stub, tmp_path: Path) -> None:
    stub.routes["/a"] = cut_short(b"0123456789")  # type: ignore[assignment]
    with open(tmp_path / "a", "w+b") as out:
        got = refusal_of(lambda: client(tries=2).download(f"{stub.url}/a", out, NOT_FOUND))
    assert got.code == 3
    assert str(got).startswith(
        f"could not reach {stub.url}/a: the answer was cut short (5 bytes missing) (tried 2 times"
    ), got


# --- failures ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "token_env", "line"),
    [
        (404, "HF_TOKEN", NOT_FOUND),
        (401, "HF_TOKEN", "{url} answered 401; check the HF_TOKEN environment variable on the controller"),
        (403, "HF_TOKEN", "{url} answered 403; check the HF_TOKEN environment variable on the controller"),
        (401, None, "{url} answered 401; the store wants a valid token (--token-file)"),
        (403, None, "{url} answered 403; the store wants a valid token (--token-file)"),
        (410, None, "{url} answered 410 Gone"),
        (400, "HF_TOKEN", "{url} answered 400 Bad Request"),
    ],
)  # fmt: skip
def test_a_refusing_answer_is_one_line_asked_once(
    status: int, token_env: str | None, line: str, stub: Stub, tmp_path: Path
) -> None:
    stub.routes["/m"] = respond(status, b"no\n")
    url = f"{stub.url}/m"
    got = refusal_of(lambda: client(TOKEN, token_env, tries=3).read(url, NOT_FOUND, 100))
    assert (str(got), got.code) == (line.format(url=url), 1)
    with open(tmp_path / "a", "w+b") as out:
        got = refusal_of(lambda: client(TOKEN, token_env, tries=3).download(url, out, NOT_FOUND))
    assert (str(got), got.code) == (line.format(url=url), 1)
    assert stub.paths() == ["/m", "/m"]


def hanging(sent: bytes, length: int, release: threading.Event) -> object:
    """200 with a Content-Length of ``length``, ``sent`` written, then nothing more until the
    test releases it."""

    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(length))
        handler.end_headers()
        handler.wfile.write(sent)
        handler.wfile.flush()
        release.wait(30)

    return route


def test_a_read_over_its_limit_stops_reading_at_one_byte_over(stub: Stub) -> None:
    """The answer is refused as soon as one byte over the limit came: the rest (which this
    server holds back) is never waited for."""
    release = threading.Event()
    stub.routes["/m"] = hanging(b"x" * 11, 1000, release)  # type: ignore[assignment]
    try:
        got = refusal_of(lambda: http_client.Client(None, None, 3.0, 1, 0.0).read(
            f"{stub.url}/m", NOT_FOUND, 10))  # fmt: skip
    finally:
        release.set()
    assert (str(got), got.code) == (f"{stub.url}/m is larger than 10 bytes", 1)


def test_an_answer_cut_at_exactly_the_limit_is_not_taken_whole(stub: Stub) -> None:
    stub.routes["/m"] = cut_short(b"0123456789" * 2)  # type: ignore[assignment]
    got = refusal_of(lambda: client().read(f"{stub.url}/m", NOT_FOUND, 10))
    assert (str(got), got.code) == (
        f"could not reach {stub.url}/m: the answer was cut short (10 bytes missing) (tried "
        "once); worth a re-run later",
        3,
    )


def test_the_client_tries_with_its_own_tries_and_wait(
    stub: Stub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import retry

    asked: list[tuple[int, float]] = []
    real = retry.attempts

    def attempts(once: Any, tries: int, first_wait: float = 99.0) -> Any:
        asked.append((tries, first_wait))
        return real(once, tries, 0.0)

    monkeypatch.setattr(retry, "attempts", attempts)
    stub.routes["/m"] = respond(200, b"{}")
    made = http_client.Client(None, None, 5.0, 3, 0.25)
    assert made.read(f"{stub.url}/m", NOT_FOUND, 10) == b"{}"
    with open(tmp_path / "a", "w+b") as out:
        made.download(f"{stub.url}/m", out, NOT_FOUND)
    assert asked == [(3, 0.25), (3, 0.25)]


def test_why_a_wrapped_timeout_failed() -> None:
    made = http_client.Client(None, None, 2.5, 1, 0.0)
    assert made._why(urllib.error.URLError(TimeoutError("timed out"))) == "no answer within 2.5 s"
    assert made._why(TimeoutError("timed out")) == "no answer within 2.5 s"
    assert made._why(urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))) == (
        "Connection refused"
    )


class Full(io.BytesIO):
    """A file on a full disk."""

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_download_that_cannot_be_written_is_one_line_asked_once(stub: Stub) -> None:
    stub.routes["/a"] = respond(200, b"body")
    got = refusal_of(lambda: client(tries=3).download(f"{stub.url}/a", Full(), NOT_FOUND))
    assert (str(got), got.code) == (
        f"fetching {stub.url}/a failed: OSError(28, 'No space left on device')",
        1,
    )
    assert stub.paths() == ["/a"]


def test_a_transient_status_every_time_could_not_be_reached(stub: Stub) -> None:
    stub.routes["/m"] = respond(503, b"busy\n")
    got = refusal_of(lambda: client(tries=2).read(f"{stub.url}/m", NOT_FOUND, 100))
    assert got.code == 3
    assert str(got).startswith(
        f"could not reach {stub.url}/m: answered 503 Service Unavailable (tried 2 times over "
    ), got
    assert str(got).endswith(" s); worth a re-run later"), got


def test_no_answer_in_time_says_the_timeout(stub: Stub) -> None:
    """A server that answers nothing until the client gave up (it waits on an event the test
    sets after, never a fixed sleep)."""
    release = threading.Event()

    def silent(handler: BaseHTTPRequestHandler) -> None:
        release.wait(30)

    stub.routes["/m"] = silent
    slow = http_client.Client(None, None, 0.3, 1, 0.0)
    try:
        got = refusal_of(lambda: slow.read(f"{stub.url}/m", NOT_FOUND, 100))
    finally:
        release.set()
    assert (str(got), got.code) == (
        f"could not reach {stub.url}/m: no answer within 0.3 s (tried once); worth a re-run later",
        3,
    )


def test_a_closed_port_says_connection_refused() -> None:
    server = Stub("127.0.0.1")
    server.close()
    got = refusal_of(lambda: client().read(f"{server.url}/m", NOT_FOUND, 100))
    assert (str(got), got.code) == (
        f"could not reach {server.url}/m: Connection refused (tried once); worth a re-run later",
        3,
    )


def test_a_scheme_nothing_serves_cannot_be_fetched() -> None:
    got = refusal_of(lambda: client(tries=3).read("gopher://h.invalid/m", NOT_FOUND, 100))
    assert (str(got), got.code) == (
        "cannot fetch gopher://h.invalid/m: unknown url type: gopher",
        1,
    )


def test_the_client_keeps_what_it_was_given() -> None:
    made = http_client.Client(TOKEN, "HF_TOKEN", 2.5)
    assert (made.token, made.token_env, made.timeout, made.tries, made.retry_wait) == (
        TOKEN, "HF_TOKEN", 2.5, 5, 1.0
    )  # fmt: skip
    assert any(isinstance(h, http_client.Redirects) for h in made.opener.handlers)
