"""Every download the controller makes (lock's owner check, the store manifest, sdists, the
wheelhouse) goes through one opener: a redirect to another origin never carries the request's
Authorization header, and credentials are chosen by the URL's origin, never by a name a lock
or a manifest gives.

A download that fails is one of two things: the network (a refused or reset connection, a
timeout, a name that does not resolve, or an HTTP status that says "later"), :func:`transient`
(the retry rule's, :mod:`servefleet.base.remote.retry`), raised as :func:`unreachable` (exit 3,
worth a retry); or a refusal (401, 403, 404, a hash that differs), the caller's own one-line
error (exit 2 or 1), never retried."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Mapping

from servefleet.base.errors import Unreachable

# the host fetcher's own rules, so both sides agree on what an origin is and what crosses it
from servefleet.base.remote.http_client import Redirects, origin, same_origin
from servefleet.base.remote.retry import reason, transient

__all__ = ["credentials_for", "opener", "origin", "same_origin", "transient", "unreachable"]


def opener() -> urllib.request.OpenerDirector:
    """A URL opener whose redirects to another origin drop the Authorization header."""
    return urllib.request.build_opener(Redirects)


def credentials_for(url: str, allowed: Iterable[str], headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` (credentials) when ``url`` has the origin of one of ``allowed`` (the data's
    URLs they belong to: its indexes with auth, its model store), else none.

    + url: what is about to be fetched
    + allowed: the URLs the credentials are for (the data's, never a lock's)
    + headers: the credentials as headers
    """
    return dict(headers) if same_origin(url, allowed) else {}


def unreachable(what: str, error: BaseException) -> Unreachable:
    """The one line for ``what`` (a URL, an index) that could not be reached: the CLI exits 3.

    + what: what the command needed
    + error: why (:func:`transient`, the retry rule's: :mod:`servefleet.base.remote.retry`)
    """
    return Unreachable(f"{what}: could not reach it ({reason(error)}); transient: try again later")
