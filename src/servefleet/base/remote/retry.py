"""The retry rule, written once for the controller's downloads and the host programs: what is
worth another try, how many tries and how long between them.

Worth another try (:func:`transient`): what the network may get right a moment later, a
connection refused, reset or cut short, a timeout, a name that does not resolve, an HTTP status
that says "not now" (:data:`TRANSIENT_HTTP`: 408, 425, 429, 500, 502, 503, 504). Never: a
refusal (401, 403, 404 and every other status), a certificate that does not verify, a local
file error, a wrong hash (the caller's own check, raised as something else). :func:`attempts`
runs a try up to :data:`TRIES` times, waiting :data:`FIRST_WAIT` seconds, then twice as long
each time (at most :data:`MAX_WAIT`, each wait between half and all of that, so hosts that
failed together do not come back together; a ``Retry-After`` of the server's is honoured up to
:data:`MAX_RETRY_AFTER`), and raises :class:`GaveUp` when every try failed transiently: the
thing could not be reached, which the controller reports as ``Unreachable`` (exit 3) and the
host programs as their exit status 3.

Stdlib only, and a leaf: the controller imports it as ``servefleet.base.remote.retry``, the host
programs as ``retry`` (the deploy uploads it with them to ``<serve_root>/lib``).
"""

from __future__ import annotations

import errno
import http.client
import random
import socket
import ssl
import time
import urllib.error
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TRIES = 5  # in all: the first and four more
FIRST_WAIT = 1.0  # seconds before the second try; doubled before each next one
MAX_WAIT = 16.0
MAX_RETRY_AFTER = 60.0  # the most of a server's Retry-After that is waited
TRANSIENT_HTTP = frozenset({408, 425, 429, 500, 502, 503, 504})  # "not now", not "no"
UNREACHABLE_EXIT = 3  # a host program's exit status for "could not reach" (as the CLI's)
# errnos of a network that is down or a peer that went away, raised without a URLError around
_NETWORK_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENETUNREACH", "EHOSTUNREACH", "ENETDOWN", "EHOSTDOWN", "ETIMEDOUT", "EPIPE")
    if hasattr(errno, name)
)


class Again(Exception):
    """Raised by a try that failed in a way worth another; its message says how (for a failure
    :func:`transient` cannot see, such as a child process's)."""


class GaveUp(Exception):
    """Every try failed transiently: ``last`` is the last failure, ``tries`` how many ran and
    ``seconds`` how long they took, the waits between them included."""

    def __init__(self, last: BaseException, tries: int, seconds: float) -> None:
        super().__init__(f"{reason(last)} ({tried(tries, seconds)})")
        self.last = last
        self.tries = tries
        self.seconds = seconds


def tried(tries: int, seconds: float) -> str:
    """``tried 5 times over 14.2 s`` (``tried once`` for one try).

    + tries: how many tries ran
    + seconds: how long they took
    """
    return "tried once" if tries == 1 else f"tried {tries} times over {seconds:.1f} s"


def transient(exc: BaseException) -> bool:
    """Whether a failure is worth another try (see the module's docstring).

    + exc: what a request (or reading its answer) raised
    """
    if isinstance(exc, Again):
        return True
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in TRANSIENT_HTTP
    if isinstance(exc, urllib.error.URLError):  # urlopen's wrapper around the socket's error
        return isinstance(exc.reason, BaseException) and transient(exc.reason)
    if isinstance(exc, ssl.SSLError):  # a certificate or protocol refusal, unless cut short
        return isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError))
    if isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror, socket.herror)):
        return True
    if isinstance(exc, http.client.HTTPException):  # an answer cut short or garbled
        return True
    return isinstance(exc, OSError) and exc.errno in _NETWORK_ERRNOS


def check_whole(response: object) -> None:
    """Raise ``http.client.IncompleteRead`` (transient) when an answer read to its end held
    less than its Content-Length: ``http.client`` returns what came before the connection was
    cut as if it were all, which a caller would take for a file with another hash.

    + response: what ``urlopen`` gave, read until it returned no more
    """
    left = getattr(response, "length", None)
    if left:
        raise http.client.IncompleteRead(b"", left)


def reason(exc: BaseException) -> str:
    """A few words for a failure: ``answered 503 Service Unavailable``, ``Connection refused``,
    ``timed out``.

    + exc: the failure
    """
    if isinstance(exc, urllib.error.HTTPError):
        return f"answered {exc.code} {exc.reason}".rstrip()
    if isinstance(exc, urllib.error.URLError):
        inner = exc.reason
        return reason(inner) if isinstance(inner, BaseException) else str(inner)
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, http.client.IncompleteRead):
        return f"the answer was cut short ({exc.expected} bytes missing)"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def wait_before(tries_done: int, exc: BaseException, first_wait: float = FIRST_WAIT) -> float:
    """The seconds to wait before the next try, after ``tries_done`` failed (the last with
    ``exc``): doubling from ``first_wait``, at most :data:`MAX_WAIT`, jittered; or the server's
    ``Retry-After`` (seconds) when that is longer, at most :data:`MAX_RETRY_AFTER`.

    + tries_done: the tries run so far (1 or more)
    + exc: the last one's failure
    + first_wait: the wait after the first try
    """
    wait = min(first_wait * 2 ** (tries_done - 1), MAX_WAIT) * random.uniform(0.5, 1.0)
    headers = getattr(exc, "headers", None) if isinstance(exc, urllib.error.HTTPError) else None
    after = (headers.get("Retry-After") or "").strip() if headers is not None else ""
    if after.isdigit():
        wait = max(wait, min(float(after), MAX_RETRY_AFTER))
    return wait


def attempts(
    try_once: Callable[[], T],
    tries: int = TRIES,
    first_wait: float = FIRST_WAIT,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """What ``try_once()`` returns, tried again after a transient failure, at most ``tries``
    times in all; a failure that is not transient is raised at once, as it is.

    + try_once: one try (it starts over from nothing: a download truncates what it wrote)
    + tries: the most tries (1: no retry)
    + first_wait: seconds before the second try (doubled before each next one)
    + sleep: how to wait (tests give their own)
    """
    start = time.monotonic()
    for done in range(1, max(tries, 1) + 1):
        try:
            return try_once()
        except Exception as exc:
            if not transient(exc):
                raise
            if done >= tries:
                raise GaveUp(exc, done, time.monotonic() - start) from exc
            if isinstance(exc, urllib.error.HTTPError):
                exc.close()  # its connection, before the next
            sleep(wait_before(done, exc, first_wait))
    raise AssertionError("the loop returns or raises")  # pragma: no cover
