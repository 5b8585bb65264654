"""The uv binary releases are installed with, at ``<serve_root>/lib/uv-<version>`` on each host:
the version a lock pins (#53: so a controller's newer uv changes nothing on the hosts), else the
controller's own. The host takes it from that version's manylinux x86_64 wheel on the public
index (or the wheelhouse copy of it), by the sha256 the lock pins or the index lists
(:func:`uv_wheel`), so the controller sends no uv to any host (#32 item 8); only with no public
index named does the deploy send the controller's own binary."""

from __future__ import annotations

import functools
import importlib.metadata
import re
from pathlib import Path
from typing import Any

from servefleet.base.once import once
from servefleet.release import simpleindex


@functools.lru_cache(maxsize=1)
def uv_version() -> str:
    """The version of the controller's uv."""
    return importlib.metadata.version("uv")


def uv_binary() -> Path:
    """The uv executable on the controller."""
    from uv import find_uv_bin

    return Path(find_uv_bin())


def host_uv(root: str, version: str) -> str:
    """Where a host keeps a uv: ``<serve_root>/lib/uv-<version>``.

    + root: serve_root
    + version: the uv version the hosts run (``servefleet.release.plan.host_uv_version``)
    """
    return f"{root}/lib/uv-{version}"


def last_error(text: str) -> str:
    """uv's reason for a failure, in one line (its ``error:``/``cause:`` lines).

    + text: uv's stderr
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error:", "×", "Caused by", "cause:"))]
    return " ".join((errors or lines[-1:] or ["no output"])[:3])


_HOST_WHEEL = re.compile(r"uv-(?P<v>[^-]+)-py3-none-(?P<tags>[A-Za-z0-9_.]+)\.whl")
_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_x86_64|manylinux(2014)_x86_64")


def _glibc(tags: str) -> tuple[int, int] | None:
    """The lowest glibc of a wheel's manylinux x86_64 tags (None: it has none)."""
    found = []
    for tag in tags.split("."):
        m = _MANYLINUX.fullmatch(tag)
        if m:
            found.append((2, 17) if m[3] else (int(m[1]), int(m[2])))
    return min(found) if found else None


@once
def uv_wheel(index: str | None, version: str | None = None) -> dict[str, Any] | None:
    """The uv wheel hosts take uv from: ``{"version", "file", "url", "sha256"}`` of uv
    ``version`` (default: the controller's) for manylinux x86_64 with the lowest glibc, on the
    public index ``index``; None when no index is named (the deploy then sends the controller's
    binary). Raises ``Unreachable`` or ``simpleindex.PageError`` when the index does not answer
    with it, ServefleetError when it lists no such wheel with a sha256.

    + index: the public index (``pip_public_index``)
    + version: the uv version
    """
    if not index:
        return None
    version = version or uv_version()
    found = []
    for name, (url, digest) in simpleindex.project_files(index, "uv").items():
        m = _HOST_WHEEL.fullmatch(name)
        glibc = _glibc(m["tags"]) if m and m["v"] == version else None
        if glibc and digest:
            found.append((glibc, name, url, digest))
    if not found:
        raise simpleindex.PageError(
            f"{index.rstrip('/')}/uv/: no uv {version} wheel for manylinux x86_64 with a sha256; "
            "the hosts take uv from it"
        )
    _, name, url, digest = min(found)
    return {"version": version, "file": name, "url": url, "sha256": digest}
