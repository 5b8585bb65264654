"""Each owned package of a lock comes from its owner: the check ``servefleet lock`` makes after
resolving (an owner's index asked, with its credentials, whether it serves each public package
too), and what changed on an index since a release was installed.

Controller-side; imports no pyinfra.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from servefleet.base.download import opener, unreachable
from servefleet.base.remote import retry
from servefleet.release.pylock import files_of, packages
from servefleet.release.stack import LockError, Stack, basic_auth


def _get(url: str, auth: tuple[str, str] | None) -> int:
    request = urllib.request.Request(url, headers={"Accept": "text/html", **(
        basic_auth(*auth) if auth else {})})  # fmt: skip

    def once() -> int:
        with opener().open(request, timeout=30) as response:
            return int(response.status)

    try:
        return retry.attempts(once)
    except retry.GaveUp as e:
        raise unreachable(url.rsplit("/", 2)[0], e.last) from None
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError) as e:
        raise LockError(f"{url.rsplit('/', 2)[0]}: not reachable ({e})") from None


def check_owners(
    st: Stack, pylock: str, user: str | None = None, password: str | None = None
) -> None:
    """Refuse a locked public package that an owner's index serves too (the data must say whose
    it is); and an owned package that did not come from its owner.

    + st: the stack
    + pylock: its lock
    + user, password: credentials for indexes with ``auth``
    """
    urls = {i["name"]: i["url"] for i in st.inputs["indexes"]}
    owners = st.owners()
    locked = packages(pylock)
    for p in locked:
        owner = owners.get(p["name"])
        if owner and p.get("index", "").rstrip("/") != urls[owner]:
            raise LockError(
                f"{p['name']} resolved from {p.get('index')}, not from its owner {urls[owner]}"
            )
    public = sorted(p["name"] for p in locked if p["name"] not in owners)
    asks = [
        (name, i["name"], f"{i['url']}/{name}/", (user, password) if i["auth"] else None)
        for name in public
        for i in st.inputs["indexes"]
    ]
    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(lambda a: _get(a[2], a[3]), asks))  # type: ignore[arg-type]
    for (name, index, _url, _auth), code in zip(asks, codes, strict=True):
        if code == 200:
            raise LockError(
                f"{name} is served by the {index} index and by the public index; name its owner "
                f"in pip_indexes.<index>.packages"
            )


def changed_on_index(installed: Mapping[str, Any], pylock: str) -> dict[str, dict[str, Any]]:
    """Packages whose version the indexes still serve, but not with any file the release was
    installed with (a re-upload under the same name and version).

    + installed: package -> [version, sha256s] the release was installed with
    + pylock: what the indexes resolve to now
    """
    out = {}
    for p in packages(pylock):
        have = installed.get(p["name"])
        served = sorted(f["sha256"] for f in files_of(p))
        if have and have[0] == p["version"] and not set(have[1]) & set(served):
            out[p["name"]] = {"version": p["version"], "installed": sorted(have[1]),
                              "served": served}  # fmt: skip
    return out
