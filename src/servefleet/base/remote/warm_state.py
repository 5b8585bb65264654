#!/usr/bin/env python3
"""Whether a compile fingerprint is warm on a host. Runs ON THE HOST, as root, with the system
python3 (stdlib only), next to ``instances.py`` and ``prewarm.py``.

usage: warm_state.py drop CACHE_ROOT FINGERPRINT UNIT   # a cache that drifted from its seal

A warm marker is root's record, in its own directory of the serve user's cache root
(``layout.WARM_DIR``, read through ``trusted``: what a serving process put there never counts),
that the cache of a fingerprint is here: which directories hold it, where it came from, and its
seal (each file's size and sha256 when the compile ended). A fleet pre-warm copies those
directories to the other hosts, packed only from a cache that still matches its seal.

A sealed cache is root's (#36): when it is marked warm, each of its directories and files is
chowned to root, group and other write bits off, readable by the serve user's group, so the serve
user can read it and not write into it (it can still rename it away inside its own tree: the
cache is then missing, which the seal check sees).

``drop`` (#36: a deploy with ``serve_verify`` that found the cache differing from its seal, just
before its converge): when the cache still differs from its seal (a fleet copy may have replaced
it since), UNIT (the first instance the converge restarts) is stopped, the cache's directories
are moved into root's own ``layout.DROPPED`` in the cache root, the warm marker is removed, then
what was moved: the converge then restarts UNIT cold, so it compiles again and is sealed anew.
The drifted files never stay where a server or a seal could take them once the marker is gone;
what a drop killed midway left in ``layout.DROPPED`` is removed by the next drop or converge
(:func:`sweep`). Prints what differed; exit 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import content_check  # noqa: E402  (next to this file on the host)
import fault_point  # noqa: E402
import layout  # noqa: E402
import systemd_units  # noqa: E402
import trusted  # noqa: E402

BUNDLE_LINE = re.compile(r"rbln mega-cache bundle (?:to|from) (/\S+/mega_cache\.bin)")


def warm_dir(state: dict[str, Any], create: bool = False) -> int | None:
    """A descriptor of root's own warm-marker directory in the serve user's cache root (see
    ``trusted``: what a serving process put there instead never counts); None: there is none."""
    if not create:
        return trusted.root_dir_in(state["cache_root"], layout.WARM_DIR)
    os.makedirs(state["cache_root"], exist_ok=True)
    parent = trusted.open_dir(state["cache_root"])
    if parent is None:
        raise systemd_units.Failed(f"{state['cache_root']} is not a directory")
    try:
        return trusted.root_dir(parent, layout.WARM_DIR, create=create)
    finally:
        os.close(parent)


def warm_record(state: dict[str, Any], fingerprint: str) -> dict[str, Any] | None:
    """The warm marker of ``fingerprint`` (None: not warm here)."""
    return content_check.cache_record(state["cache_root"], fingerprint)


def is_cold(state: dict[str, Any], inst: dict[str, Any]) -> bool:
    """Its compile fingerprint is not warm here (``-``: nothing compiles, never cold)."""
    if inst["fingerprint"] == "-":
        return False
    fd = warm_dir(state)
    if fd is None:
        return True
    try:
        return not trusted.is_file(fd, inst["fingerprint"])
    finally:
        os.close(fd)


def bundle_dirs(state: dict[str, Any], unit: str, since: float) -> list[str]:
    """The compile-cache directories this start saved or loaded, relative to the cache root:
    ``rbln/<model>/<sig>`` from vllm-rbln's "Saved/Loaded rbln mega-cache bundle" lines in this
    invocation's journal, else the bundles written since ``since``. They are what a fleet
    pre-warm copies to the other hosts."""
    root = Path(state["cache_root"])
    invocation = systemd_units.show([unit], "InvocationID")[0].get("InvocationID", "")
    found: set[Path] = set()
    for _ in range(10 if invocation else 0):  # journald may lag the first answer a little
        out = subprocess.run(
            ["journalctl", "-o", "cat", "--no-pager", f"_SYSTEMD_INVOCATION_ID={invocation}"],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        found = {Path(m) for m in BUNDLE_LINE.findall(out)}
        if found:
            break
        time.sleep(0.5)
    if not found:
        found = {
            p for p in root.glob("rbln/*/*/rank*/mega_cache.bin") if p.stat().st_mtime >= since
        }
    dirs = set()
    for bundle in found:
        with contextlib.suppress(ValueError):
            rel = bundle.parent.parent.relative_to(root)
            if len(rel.parts) == 3 and ".." not in rel.parts and bundle.is_file():
                dirs.add(str(rel))  # only a cache that is on disk now can be copied
    return sorted(dirs)


def mark_warm(
    state: dict[str, Any],
    fingerprint: str,
    dirs: list[str],
    source: str = "",
    seal: dict[str, list[Any]] | None = None,
) -> None:
    """The fingerprint is warm here; ``dirs`` hold its cache (a fleet pre-warm copies them).

    The record carries the cache's seal: each file's size and sha256 as root found them when
    the compile ended (``seal``: a checked copy's manifest). A fleet copy is packed only from a
    cache that still matches it, so what a serving process wrote since never leaves the host.
    """
    seal_tree(state["cache_root"], dirs)  # root's first: nothing writes after it is hashed
    if seal is None:
        seal = cache_seal(state["cache_root"], dirs)
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "dirs": dirs,
        "source": source or "compiled",
        "seal": seal,
    }
    fd = warm_dir(state, create=True)
    assert fd is not None
    try:
        trusted.write(fd, fingerprint, json.dumps(record, sort_keys=True) + "\n")
    finally:
        os.close(fd)


def cache_seal(cache_root: str, dirs: list[str]) -> dict[str, list[Any]] | None:
    """The files of ``dirs`` under the serve user's cache root, read through descriptors with no
    link followed (None when one is not a plain tree: that cache is never copied)."""
    cache = trusted.open_dir(cache_root)
    if cache is None:
        return None
    try:
        seal: dict[str, list[Any]] = {}
        for d in dirs:
            fd = trusted.open_below(cache, d)
            try:
                seal.update(trusted.digests(fd, d))
            finally:
                os.close(fd)
        return seal
    except OSError:
        return None
    finally:
        os.close(cache)


def seal_tree(cache_root: str, dirs: list[str]) -> None:
    """Each directory and regular file of ``dirs`` (below the serve user's cache root) made
    root's: owner root, group the cache root's, mode 0750 for a directory and 0640 (0750 when
    executable) for a file, through descriptors with no link followed. A file with more than one
    link, or one another user owns, is left as it is (it may be another tree's: the seal still
    covers what it holds); a link or a fifo is left too (nothing can change one in a directory
    root owns)."""
    cache = trusted.open_dir(cache_root)
    if cache is None:
        return
    try:
        serve, group = os.fstat(cache).st_uid, os.fstat(cache).st_gid
        for d in dirs:
            try:
                top = trusted.open_below(cache, d)
            except OSError:
                continue  # not there (or not a plain tree): nothing to seal
            try:
                _seal(top, serve, group)
            finally:
                os.close(top)
    finally:
        os.close(cache)


def _seal(top: int, serve: int, group: int) -> None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _, _, filenames, dirfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
        _own(dirfd, serve, group, 0o750)
        for name in filenames:
            try:
                f = os.open(name, flags, dir_fd=dirfd)
            except OSError:
                continue  # a link (ELOOP) or gone
            try:
                st = os.fstat(f)
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    _own(f, serve, group, 0o750 if st.st_mode & 0o111 else 0o640)
            finally:
                os.close(f)


def _own(fd: int, serve: int, group: int, mode: int) -> None:
    st = os.fstat(fd)
    if st.st_uid in (serve, 0) and (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) != (
        0, group, mode
    ):  # fmt: skip
        os.fchown(fd, 0, group)
        os.fchmod(fd, mode)


def seal_warm(cache_root: str, fingerprints: list[str]) -> None:
    """The warm caches of ``fingerprints`` made root's (:func:`seal_tree`) where they are not
    yet: a cache sealed before seals made it root's is at the next converge (idempotent: one
    walk of its few files, nothing changed when it is root's already)."""
    for fp in sorted(set(fingerprints) - {"-", ""}):
        record = warm_record({"cache_root": cache_root}, fp)
        if record is not None:
            seal_tree(cache_root, [str(d) for d in record.get("dirs") or []])


def drop(cache_root: str, fingerprint: str, unit: str) -> None:
    """The cache of ``fingerprint`` dropped when it still differs from its seal: ``unit``
    stopped, its directories moved into root's ``layout.DROPPED``, the marker removed, then what
    was moved (see above)."""
    sweep(cache_root)
    record = warm_record({"cache_root": cache_root}, fingerprint)
    if record is None:
        print(f"cache {fingerprint}: not warm here: nothing to drop")
        return
    differ = content_check.verify_cache(cache_root, record)["differ"]
    if not differ:
        print(f"cache {fingerprint}: matches its seal: kept")
        return
    for line in differ:
        print(f"cache {fingerprint}: {line}")
    systemd_units.systemctl("stop", unit, check=False)  # the converge restarts it: it compiles
    _move_out(cache_root, [str(d) for d in record.get("dirs") or []])
    fault_point.barrier("cache-moved-out")  # tests' fault point: the next run converges
    fd = warm_dir({"cache_root": cache_root})
    if fd is not None:
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(fingerprint, dir_fd=fd)
        finally:
            os.close(fd)
    sweep(cache_root)
    print(f"cache {fingerprint}: dropped; {unit} compiles it again at its restart")


def _dropped_dir(cache_root: str, create: bool) -> tuple[int, int] | None:
    """(the cache root's descriptor, root's ``layout.DROPPED`` in it), or None."""
    cache = trusted.open_dir(cache_root)
    if cache is None:
        return None
    try:
        fd = trusted.root_dir(cache, layout.DROPPED, create=create)
    except OSError:
        fd = None
    if fd is None:
        os.close(cache)
        return None
    return cache, fd


def _move_out(cache_root: str, dirs: list[str]) -> None:
    """Rename each of ``dirs`` (relative to the serve user's cache root) into root's own
    ``layout.DROPPED`` there, through descriptors (a link is moved, never followed): out of
    every server's and seal's way at once, on the same file system."""
    found = _dropped_dir(cache_root, create=True)
    if found is None:
        return
    cache, dropped = found
    try:
        for d in dirs:
            *up, name = d.split("/")
            try:
                parent = content_check.open_dirs(cache, up)
            except OSError:
                continue  # gone already
            try:
                os.rename(name, f"{name}-{time.time_ns()}", src_dir_fd=parent, dst_dir_fd=dropped)
            except OSError:
                pass  # gone already
            finally:
                os.close(parent)
    finally:
        os.close(dropped)
        os.close(cache)


def sweep(cache_root: str) -> None:
    """Remove what root's ``layout.DROPPED`` holds (a drop killed midway left it there)."""
    found = _dropped_dir(cache_root, create=False)
    if found is None:
        return
    cache, dropped = found
    try:
        for name in sorted(os.listdir(dropped)):
            trusted.remove_in(dropped, name)
    finally:
        os.close(dropped)
        os.close(cache)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "drop":
        print("usage: warm_state.py drop CACHE_ROOT FINGERPRINT UNIT", file=sys.stderr)
        sys.exit(2)
    drop(*sys.argv[2:])
