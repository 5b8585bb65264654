"""Every download the controller makes (lock's owner check, the store manifest, sdists, the
wheelhouse) goes through one opener: a redirect to another origin never carries the request's
Authorization header, and credentials are chosen by the URL's origin, never by a name a lock
or a manifest gives."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Mapping

# the host fetcher's own rules, so both sides agree on what an origin is and what crosses it
from servefleet.remote.fetch_model import _origin as origin, _Redirects

__all__ = ["credentials_for", "opener", "origin"]


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
