"""Every download the controller makes (lock's owner check, the store manifest, sdists, the
wheelhouse) goes through one opener: a redirect to another origin never carries the request's
Authorization header, and credentials are chosen by the URL's origin, never by a name a lock
or a manifest gives.

A download that fails is one of two things: the network (a refused or reset connection, a
timeout, a name that does not resolve, or an HTTP status that says "later": 408, 429, 5xx),
:func:`transient`, raised as :func:`unreachable` (exit 3, worth a retry); or a refusal (401,
403, 404, a hash that differs), the caller's own one-line error (exit 2 or 1), never retried."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping

from servefleet.errors import Unreachable

# the host fetcher's own rules, so both sides agree on what an origin is and what crosses it
from servefleet.remote.fetch_model import _origin as origin, _Redirects

__all__ = ["credentials_for", "opener", "origin", "transient", "unreachable"]

# HTTP statuses that say "not now" rather than "no": a retry later may succeed
TRANSIENT_HTTP = frozenset({408, 425, 429, 500, 502, 503, 504})


def opener() -> urllib.request.OpenerDirector:
    """A URL opener whose redirects to another origin drop the Authorization header."""
    return urllib.request.build_opener(_Redirects)


def credentials_for(
    url: str, index_urls: Iterable[str], headers: Mapping[str, str]
) -> dict[str, str]:
    """``headers`` (an index's credentials) when ``url`` has the origin of one of ``index_urls``
    (the indexes they belong to), else none.

    + url: what is about to be fetched
    + index_urls: the URLs of the indexes the credentials are for
    + headers: the credentials as headers
    """
    return dict(headers) if origin(url) in {origin(u) for u in index_urls} else {}


def transient(error: BaseException) -> bool:
    """Whether a failed request is the network's doing and worth a retry: a connection refused
    or reset, a timeout, a name that does not resolve, an HTTP status of
    :data:`TRANSIENT_HTTP`; an HTTP refusal (401, 403, 404, ...) is not.

    + error: what ``opener().open`` (or reading its response) raised
    """
    if isinstance(error, urllib.error.HTTPError):
        return error.code in TRANSIENT_HTTP
    return isinstance(error, OSError)  # URLError, TimeoutError, ConnectionError are OSErrors


def unreachable(what: str, error: BaseException) -> Unreachable:
    """The one line for ``what`` (a URL, an index) that could not be reached: the CLI exits 3.

    + what: what the command needed
    + error: why (:func:`transient`)
    """
    if isinstance(error, urllib.error.HTTPError):
        why = f"it answered {error.code} {error.reason}"
    else:
        why = str(getattr(error, "reason", None) or error) or type(error).__name__
    return Unreachable(f"{what}: could not reach it ({why}); transient: try again later")
