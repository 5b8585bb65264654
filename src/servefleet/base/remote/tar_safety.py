"""A model archive's safety (stdlib only, on the host): every member of a store archive is
checked before anything is extracted, and the archive is refused whole when one could write or
point outside ``models--ORG--NAME/`` (an absolute path, ``..``, a symlink resolving outside, a
hard link, a device or fifo, a member inside a symlinked directory, the completeness marker).
Python's ``data`` tar filter, where the host's python3 has it, checks the extraction again.
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from pathlib import Path
from typing import Any

if __package__:  # the controller imports this module (servefleet.base.remote.tar_safety)
    from servefleet.base.remote import layout, refusal
else:  # on the host, next to layout.py and refusal.py
    import layout  # type: ignore[no-redef]
    import refusal  # type: ignore[no-redef]

MAX_LINK_HOPS = 40  # as the kernel's MAXSYMLINKS
DATA_FILTER = hasattr(tarfile, "data_filter")  # 3.12, and the 3.10.12/3.11.4 backports
FILTER_ERROR: Any = getattr(tarfile, "FilterError", ())  # nothing to catch before them


def _parts(name: str) -> list[str]:
    return [p for p in name.split("/") if p not in ("", ".")]


def _link_problem(path: str, links: dict[str, str], top: str) -> str | None:
    """Why path, resolved as the kernel would through the archive's own symlinks (links: member
    path -> target), does not end inside top; None when it does."""
    outside = f"resolves outside {top}/"
    done: list[str] = []
    todo = path.split("/")[::-1]
    hops = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                return outside
            done.pop()
            continue
        done.append(part)
        target = links.get("/".join(done))
        if target is not None:
            hops += 1
            if hops > MAX_LINK_HOPS:
                return "a symlink loop"
            if target.startswith("/"):
                return outside
            done.pop()
            todo.extend(target.split("/")[::-1])
    return None if done and done[0] == top else outside


def unsafe_member(members: list[tarfile.TarInfo], top: str) -> tuple[str, str] | None:
    """The first member that could write or point outside top, and why; or None.

    Allowed: directories, regular files and symlinks, each under ``top/`` once (a directory may
    repeat), no member inside a symlinked directory, every symlink resolving inside top.

    + members: the archive's members
    + top: the one directory the archive may hold (``models--ORG--NAME``)
    """
    seen: dict[str, bool] = {}
    links: dict[str, str] = {}
    for m in members:
        parts = _parts(m.name)
        if m.name.startswith("/"):
            return m.name, "absolute path"
        if ".." in parts:
            return m.name, "'..' in its path"
        if not parts or parts[0] != top:
            return m.name, f"outside {top}/"
        if len(parts) > 1 and parts[1].startswith(layout.MODEL_COMPLETE):
            return m.name, "only the fetcher writes the completeness marker"
        if m.islnk():
            return m.name, "hard link"
        if m.ischr() or m.isblk() or m.isfifo():
            return m.name, "device or fifo"
        if not (m.isreg() or m.isdir() or m.issym()):
            return m.name, "special file"
        key = "/".join(parts)
        if key in seen and not (seen[key] and m.isdir()):
            return m.name, "appears twice"
        seen[key] = m.isdir()
        if m.issym():
            if m.linkname.startswith("/"):
                return m.name, f"symlink to the absolute path {m.linkname}"
            links[key] = m.linkname
    for m in members:
        parts = _parts(m.name)
        if any("/".join(parts[:i]) in links for i in range(1, len(parts))):
            return m.name, "inside a symlinked directory"
        problem = _link_problem(m.name, links, top) if m.issym() else None
        if problem:
            return m.name, f"symlink to {m.linkname}: {problem}"
    return None


def unpack(archive: Path, dest: Path, top: str, url: str) -> Path:
    """Check every member of archive, then extract it into dest; return ``dest/top``.

    + archive: the downloaded tar.gz
    + dest: an empty directory to create
    + top: the one directory the archive may hold
    + url: where the archive came from (for messages)
    """
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            unsafe = unsafe_member(members, top)
            if unsafe:
                raise refusal.Refusal(f"{url}: unsafe member {unsafe[0]!r} ({unsafe[1]})")
            for m in members:  # plain permissions, whatever the archive says
                m.mode = 0o755 if m.isdir() or m.mode & 0o111 else 0o644
            dest.mkdir()
            tar.errorlevel = 2
            if DATA_FILTER:
                tar.extractall(dest, members, filter="data")
            else:
                tar.extractall(dest, members)
    except FILTER_ERROR as exc:  # the data filter caught what the checks above let by
        name = exc.tarinfo.name if exc.tarinfo else "?"
        raise refusal.Refusal(f"{url}: unsafe member {name!r} ({exc})") from None
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise refusal.Refusal(f"{url} is not a readable tar.gz ({exc})") from None
    got = dest / top
    if not got.is_dir() or got.is_symlink():
        raise refusal.Refusal(f"{url} does not hold {top}/")
    return got
