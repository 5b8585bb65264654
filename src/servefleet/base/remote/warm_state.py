"""Whether a compile fingerprint is warm on a host. Runs ON THE HOST, as root, with the system
python3 (stdlib only), next to ``instances.py`` and ``prewarm.py``.

A warm marker is root's record, in its own directory of the serve user's cache root
(``layout.WARM_DIR``, read through ``trusted``: what a serving process put there never counts),
that the cache of a fingerprint is here: which directories hold it, where it came from, and its
seal (each file's size and sha256 when the compile ended). A fleet pre-warm copies those
directories to the other hosts, packed only from a cache that still matches its seal.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layout  # noqa: E402  (next to this file on the host)
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
    fd = warm_dir(state)
    if fd is None:
        return None
    try:
        record = json.loads(trusted.read(fd, fingerprint))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return record if isinstance(record, dict) else None


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
    for _ in range(10):  # journald may lag the server's first answer a little
        if invocation:
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
