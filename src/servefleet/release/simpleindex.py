"""A package index's project page (PEP 503 "simple" HTML), read on the controller: the files of
one project, each with its URL and the sha256 the page gives. Used where servefleet needs a file
no resolver picks for it: an sdist uv must not build where credentials are
(``servefleet.release.resolve``), and the uv wheel hosts install releases with (``servefleet.release.uvbin``).

Controller-side; imports no pyinfra.
"""

from __future__ import annotations

import html.parser
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

from servefleet.base.download import credentials_for, opener
from servefleet.base.errors import ServefleetError, Unreachable
from servefleet.base.remote import retry

SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_PAGE = 8 << 20  # bytes read of a project page


class PageError(ServefleetError):
    """An index that answered, but not with the page asked for (one line)."""


class _Links(html.parser.HTMLParser):
    def __init__(self, base: str) -> None:
        super().__init__()
        self.base, self.found = base, {}  # type: str, dict[str, str]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            url = urllib.parse.urljoin(self.base, href)
            self.found[urllib.parse.unquote(url.split("#")[0].rsplit("/", 1)[-1])] = url


def project_files(
    index: str, name: str, headers: Mapping[str, str] | None = None
) -> dict[str, tuple[str, str | None]]:
    """File name -> (URL, sha256 or None) of project ``name`` on ``index``; ``headers`` (an
    index's credentials) go only to ``index``'s origin, never across a redirect to another.

    + index: the index's simple URL (``.../simple``)
    + name: the normalized project name
    + headers: its credentials, if it has any
    """
    page = f"{index.rstrip('/')}/{name}/"
    request = urllib.request.Request(page, headers={"Accept": "text/html", **credentials_for(
        page, [index], headers or {})})  # fmt: skip

    def once() -> _Links:
        with opener().open(request, timeout=60) as response:
            links = _Links(response.geturl())
            links.feed(response.read(MAX_PAGE).decode("utf-8", "replace"))
            return links

    try:
        links = retry.attempts(once)
    except retry.GaveUp as e:
        raise Unreachable(f"{page}: not reachable ({e})") from None
    except urllib.error.HTTPError as e:
        raise PageError(f"{page}: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable(f"{page}: not reachable ({retry.reason(e)})") from None
    out: dict[str, tuple[str, str | None]] = {}
    for filename, url in links.found.items():
        digest = url.partition("#sha256=")[2]
        out[filename] = (url.split("#")[0], digest if SHA256.fullmatch(digest) else None)
    return out
