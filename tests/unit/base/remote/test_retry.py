"""The retry rule (src/servefleet/base/remote/retry.py), written once for the controller and the
hosts: what is transient (tried again, with a growing wait) and what is a refusal (raised at
once); and the controller's wheelhouse downloads under it, against a local HTTP server in a
thread: 503 then 200 (tried again, downloaded), 401 (asked once, one line), a closed port (tried
again, then ``Unreachable``: exit 3). The host fetcher's retries: test_fetch_model.py (beside
this)."""

from __future__ import annotations

import errno
import hashlib
import http.client
import socket
import ssl
import urllib.error
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest
from fetch_stubs import Stub, in_turn, respond

from servefleet.base.errors import Unreachable
from servefleet.base.remote import retry
from servefleet.release.wheelhouse import Credentials, File, fill

DATA = b"a wheel's bytes\n" * 1000
SHA = hashlib.sha256(DATA).hexdigest()


def http_error(code: int, retry_after: str | None = None) -> urllib.error.HTTPError:
    headers = Message()
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return urllib.error.HTTPError("http://x/f", code, "reason", headers, None)


@pytest.mark.parametrize(
    ("exc", "again"),
    [
        (http_error(503), True),
        (http_error(429), True),
        (http_error(502), True),
        (http_error(500), True),
        (http_error(408), True),
        (http_error(401), False),
        (http_error(403), False),
        (http_error(404), False),
        (http_error(400), False),
        (http_error(501), False),
        (urllib.error.URLError(ConnectionRefusedError(errno.ECONNREFUSED, "refused")), True),
        (urllib.error.URLError(TimeoutError("timed out")), True),
        (urllib.error.URLError(socket.gaierror(-3, "Temporary failure")), True),
        (urllib.error.URLError("unknown url type: ftp"), False),
        (
            urllib.error.URLError(ssl.SSLCertVerificationError(1, "certificate verify failed")),
            False,
        ),
        (ConnectionResetError(errno.ECONNRESET, "reset"), True),
        (TimeoutError(), True),
        (http.client.IncompleteRead(b"", 10), True),
        (http.client.RemoteDisconnected("closed"), True),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), True),
        (OSError(errno.ENOSPC, "No space left on device"), False),
        (PermissionError(errno.EACCES, "Permission denied"), False),
        (ValueError("not a network error"), False),
        (retry.Again("a child's connection failed"), True),
    ],
    ids=lambda v: v if isinstance(v, bool) else f"{type(v).__name__}:{getattr(v, 'code', '')}",
)
def test_what_is_transient(exc: BaseException, again: bool) -> None:
    assert retry.transient(exc) is again


def test_the_waits_double_are_jittered_capped_and_honour_retry_after() -> None:
    for done in range(1, 8):
        want = min(retry.FIRST_WAIT * 2 ** (done - 1), retry.MAX_WAIT)
        waits = [retry.wait_before(done, http_error(503)) for _ in range(50)]
        assert all(want / 2 <= w <= want for w in waits) and len(set(waits)) > 1, (done, waits)
    assert retry.wait_before(1, http_error(429, "7")) == 7.0
    assert retry.wait_before(1, http_error(429, "3600")) == retry.MAX_RETRY_AFTER
    assert retry.wait_before(1, http_error(429, "soon")) <= retry.FIRST_WAIT


class Tries:
    """A try that fails with each of ``failures`` in turn, then returns "done"."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


def test_a_transient_failure_is_tried_again_and_a_refusal_is_not() -> None:
    slept: list[float] = []
    again = Tries(http_error(503), ConnectionResetError())
    assert retry.attempts(again, tries=5, first_wait=1, sleep=slept.append) == "done"
    assert again.calls == 3 and len(slept) == 2 and 0.5 <= slept[0] <= 1 <= slept[1] <= 2
    refused = Tries(http_error(401))
    with pytest.raises(urllib.error.HTTPError):
        retry.attempts(refused, sleep=slept.append)
    assert refused.calls == 1 and len(slept) == 2  # once, no wait
    down = Tries(*[ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")] * 9)
    with pytest.raises(retry.GaveUp) as gave_up:
        retry.attempts(down, tries=4, sleep=slept.append)
    assert down.calls == 4 and gave_up.value.tries == 4 and len(slept) == 2 + 3
    assert str(gave_up.value).startswith("Connection refused (tried 4 times over ")
    assert retry.tried(1, 0.2) == "tried once"


# --- the controller's wheelhouse downloads ---------------------------------------------------------
@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub("127.0.0.1")
    yield server
    server.close()


def one_file(url: str, auth: str | None = None) -> list[File]:
    return [File("packages/sfx-1.0-py3-none-any.whl", url, SHA, auth)]


def test_503_then_200_is_tried_again_and_downloaded(stub: Stub, tmp_path: Path) -> None:
    stub.routes["/f.whl"] = in_turn(respond(503, b"busy\n"), respond(200, DATA))
    done = fill(tmp_path / "wh", one_file(f"{stub.url}/f.whl"), Credentials(), lambda _: None,
                retry_wait=0.01)  # fmt: skip
    assert done.failed == [] and done.downloaded == ["packages/sfx-1.0-py3-none-any.whl"]
    assert (tmp_path / "wh" / done.downloaded[0]).read_bytes() == DATA
    assert stub.paths() == ["/f.whl", "/f.whl"]


def test_401_is_asked_once_and_is_one_line(stub: Stub, tmp_path: Path) -> None:
    stub.routes["/f.whl"] = respond(401, b"who are you\n")
    done = fill(tmp_path / "wh", one_file(f"{stub.url}/f.whl", "index"),
                Credentials(index_origins=(stub.url,)), lambda _: None, retry_wait=0.01)  # fmt: skip
    assert stub.paths() == ["/f.whl"]
    assert (
        done.failed
        == [
            f"packages/sfx-1.0-py3-none-any.whl: {stub.url}/f.whl answered 401 (set the variables "
            "creds_index_user_env/creds_index_password_env name)"
        ]
        and done.unreachable == []
    )


def test_a_closed_port_is_tried_again_then_unreachable(tmp_path: Path) -> None:
    server = Stub("127.0.0.1")
    server.close()  # nothing listens there now
    with pytest.raises(Unreachable) as got:
        fill(tmp_path / "wh", one_file(f"{server.url}/f.whl"), Credentials(), lambda _: None,
             tries=3, retry_wait=0.01)  # fmt: skip
    line = str(got.value)
    assert "\n" not in line and line.startswith(
        f"wheelhouse {tmp_path / 'wh'}: packages/sfx-1.0-py3-none-any.whl: could not reach "
        f"{server.url}/f.whl: Connection refused (tried 3 times over "
    ), line
    assert line.endswith("(0 downloaded, 0 already there)"), line
    assert (tmp_path / "wh" / "manifest.json").is_file()  # the files checked, still written


def test_a_refusal_among_unreachable_files_is_exit_1_not_3(stub: Stub, tmp_path: Path) -> None:
    """Unreachable only when nothing was refused: a 404 beside a closed port is returned."""
    closed = Stub("127.0.0.2")
    closed.close()
    stub.routes["/f.whl"] = respond(404)
    files = [*one_file(f"{stub.url}/f.whl"), File("driver/r.run", f"{closed.url}/r.run", SHA)]
    done = fill(tmp_path / "wh", files, Credentials(), lambda _: None, tries=2, retry_wait=0.01)
    assert len(done.failed) == 2 and len(done.unreachable) == 1
    assert done.unreachable[0].startswith(f"driver/r.run: could not reach {closed.url}/r.run")
