"""Every download the controller makes (lock's owner check, the store manifest, sdists, the
wheelhouse) goes through one opener: a redirect to another origin never carries the request's
Authorization header, and credentials are chosen by the URL's origin, never by a name a lock
or a manifest gives."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from servefleet.remote.fetch_model import _Redirects

__all__ = ["credentials_for", "opener", "origin"]


def origin(url: str) -> tuple[str, str, int | None]:
    """A URL's origin: scheme, host (lower case) and port (the scheme's default made explicit)."""
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


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
