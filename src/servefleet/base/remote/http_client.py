"""The model fetcher's HTTP client (stdlib only, on the host; the controller's downloads share
its origin rule and redirect handler, ``servefleet.base.download``).

An origin is a URL's (scheme, host, port), the port defaulting by scheme. A redirect to another
origin never carries the request's Authorization header (:class:`Redirects`). :class:`Client`
GETs with a timeout and the store's bearer token, tries a transient failure again
(``retry.py``), and turns every failure into one :class:`refusal.Refusal` line.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from typing import IO, Any
from urllib.parse import urlsplit

if __package__:  # the controller imports this module (servefleet.base.remote.http_client)
    from servefleet.base.remote import refusal, retry
else:  # on the host, next to refusal.py and retry.py
    import refusal  # type: ignore[no-redef]
    import retry  # type: ignore[no-redef]

CHUNK = 1 << 20  # bytes read at a time
DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int | None]:
    """The origin of url: its (scheme, host, port), lowercased, the port defaulting by scheme
    (-1 for a port that is not a number).

    + url: an absolute URL
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = -1
    return scheme, (parts.hostname or "").lower(), port


def same_origin(url: str, allowed: Iterable[str]) -> bool:
    """Whether url has the origin of one of ``allowed`` (scheme, host and port compared exactly;
    a URL without a host or with a port that is not a number has none): the one test of where
    a credential may go.

    + url: what is about to be fetched
    + allowed: the URLs whose origins may get it (the data's, never one a lock names)
    """
    scheme, host, port = origin(url)
    return bool(host) and port != -1 and (scheme, host, port) in {origin(u) for u in allowed}


class Redirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but never carries the Authorization header to another origin."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and not same_origin(new.full_url, [req.full_url]):
            new.remove_header("Authorization")
        return new


class Client:
    """GETs with a timeout and the store token, each tried again after a transient failure
    (:func:`retry.attempts`); every failure becomes one Refusal line, exit 3 when the store
    could not be reached.

    + token: the bearer token, or None
    + token_env: the controller's variable the token comes from (named on 401/403)
    + timeout: seconds for each connect and each read
    + tries: the most tries of each request
    + retry_wait: seconds before the second try (doubled before each next one)
    """

    def __init__(
        self,
        token: str | None,
        token_env: str | None,
        timeout: float,
        tries: int = retry.TRIES,
        retry_wait: float = retry.FIRST_WAIT,
    ) -> None:
        self.token = token
        self.token_env = token_env
        self.timeout = timeout
        self.tries = tries
        self.retry_wait = retry_wait
        self.opener = urllib.request.build_opener(Redirects)

    def _why(self, exc: BaseException) -> str:
        inner = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(inner, TimeoutError):
            return f"no answer within {self.timeout:g} s"
        return retry.reason(exc)

    @contextlib.contextmanager
    def _errors(self, url: str, not_found: str) -> Iterator[None]:
        try:
            yield
        except retry.GaveUp as gave_up:
            raise refusal.could_not_reach(url, self._why(gave_up.last), gave_up) from None
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404:
                raise refusal.Refusal(not_found) from None
            if exc.code in (401, 403):
                hint = (
                    f"check the {self.token_env} environment variable on the controller"
                    if self.token_env
                    else "the store wants a valid token (--token-file)"
                )
                raise refusal.Refusal(f"{url} answered {exc.code}; {hint}") from None
            raise refusal.Refusal(f"{url} answered {exc.code} {exc.reason}") from None
        except TimeoutError:
            raise refusal.Refusal(f"{url}: no answer within {self.timeout:g} s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise refusal.Refusal(f"{url}: no answer within {self.timeout:g} s") from None
            raise refusal.Refusal(f"cannot fetch {url}: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise refusal.Refusal(f"fetching {url} failed: {exc!r}") from None

    def _open(self, url: str) -> Any:
        request = urllib.request.Request(url)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        return self.opener.open(request, timeout=self.timeout)

    def read(self, url: str, not_found: str, limit: int) -> bytes:
        """The body of url (at most limit bytes)."""

        def once() -> bytes:
            with self._open(url) as response:
                data = bytes(response.read(limit + 1))
                if len(data) <= limit:
                    retry.check_whole(response)
                return data

        with self._errors(url, not_found):
            data = retry.attempts(once, self.tries, self.retry_wait)
        if len(data) > limit:
            raise refusal.Refusal(f"{url} is larger than {limit} bytes")
        return data

    def download(self, url: str, out: IO[bytes], not_found: str) -> str:
        """Stream url into out (from its start again on each try); return its sha256."""

        def once() -> str:
            out.seek(0)
            out.truncate()
            digest = hashlib.sha256()
            with self._open(url) as response:
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
                retry.check_whole(response)
            return digest.hexdigest()

        with self._errors(url, not_found):
            got = retry.attempts(once, self.tries, self.retry_wait)
        return got
