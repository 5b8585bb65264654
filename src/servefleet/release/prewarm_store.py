"""The controller's store of fleet pre-warm copies (``serve_prewarm_store``): one compile cache
per fingerprint, as ``<fingerprint>.tar`` (made by ``remote/prewarm.py pack`` on the host that
compiled it) and ``<fingerprint>.tar.json`` (each file's size and sha256, and the tar's).

Pure (no pyinfra import). A copy enters the store only after its size and sha256 match its
manifest, tar first, manifest last, so an interrupted pull leaves no copy that looks whole; the
host it goes to checks it all again before using it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servefleet.base.files import sha256_of

_FINGERPRINT = re.compile(r"^[0-9a-f]{8,64}$")
COMPILE_ONLY = "compile only"  # remote/layout.py's COMPILE_ONLY: a copy's one origin


class Store:
    """A directory on the controller holding fleet pre-warm copies.

    + path: ``serve_prewarm_store`` (``~`` is the controller user's home)
    """

    def __init__(self, path: str) -> None:
        self.root = Path(os.path.expanduser(path))

    def tar(self, fingerprint: str) -> Path:
        if not _FINGERPRINT.match(fingerprint):
            raise ValueError(f"not a compile fingerprint: {fingerprint!r}")
        return self.root / f"{fingerprint}.tar"

    def manifest_path(self, fingerprint: str) -> Path:
        return Path(f"{self.tar(fingerprint)}.json")

    def manifest(self, fingerprint: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self.manifest_path(fingerprint).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def has(self, fingerprint: str) -> bool:
        """A copy is here whole (its size as its manifest says; hosts check the hashes)."""
        manifest = self.manifest(fingerprint)
        tar = self.tar(fingerprint)
        return (
            manifest is not None
            and manifest.get("origin") == COMPILE_ONLY  # an older copy may come from a server
            and tar.is_file()
            and tar.stat().st_size == manifest.get("tar_size")
        )

    def parts(self, fingerprint: str, source: str) -> tuple[Path, Path]:
        """Where a pull from ``source`` downloads to before :meth:`accept`."""
        self.root.mkdir(parents=True, exist_ok=True)
        base = self.root / f".{fingerprint}.{re.sub(r'[^A-Za-z0-9._-]', '_', source)}"
        return Path(f"{base}.tar.part"), Path(f"{base}.json.part")

    def accept(self, fingerprint: str, tar_part: Path, manifest_part: Path, source: str) -> str:
        """Check a downloaded copy against its manifest and keep it; returns a one-line summary.
        Raises ValueError (one line) when it does not match; the parts are removed either way."""
        try:
            try:
                manifest = json.loads(manifest_part.read_text())
            except (OSError, ValueError):
                raise ValueError("its manifest is missing or not JSON") from None
            if not isinstance(manifest, dict) or manifest.get("fingerprint") != fingerprint:
                raise ValueError(f"its manifest is not one of fingerprint {fingerprint}")
            if manifest.get("origin") != COMPILE_ONLY:  # #31 finding 5
                raise ValueError(
                    "it does not come from a compile-only build (a server's cache is never copied)"
                )
            if not manifest.get("seal") or manifest.get("seal") != manifest.get("files"):
                raise ValueError(  # packed from a cache a serving process may have written
                    "its files are not the seal root recorded when its compile ended"
                )
            size, digest = tar_part.stat().st_size, sha256_of(tar_part)
            if [size, digest] != [manifest.get("tar_size"), manifest.get("tar_sha256")]:
                raise ValueError(
                    f"{size} bytes, sha256 {digest}; the host's manifest says "
                    f"{manifest.get('tar_size')} bytes, sha256 {manifest.get('tar_sha256')}"
                )
            manifest["source"] = source
            os.replace(tar_part, self.tar(fingerprint))
            tmp = Path(f"{manifest_part}.tmp")
            tmp.write_text(json.dumps(manifest, sort_keys=True) + "\n")
            os.replace(tmp, self.manifest_path(fingerprint))
            return f"{len(manifest.get('files', {}))} files, {size} bytes from {source}"
        finally:
            for part in (tar_part, manifest_part):
                part.unlink(missing_ok=True)


@dataclass(frozen=True)
class WarmEntry:
    """One host of a run, as fleet pre-warm sees it (from its HostPlan and the store)."""

    host: str
    fingerprint: str | None  # its compile fingerprint (None: nothing to compile)
    fleet: bool  # serve_prewarm_scope is "fleet"
    warm: bool  # the fingerprint is warm on the host
    kept: bool  # the controller's store holds a copy of it
    builder: bool  # the host is serve_prewarm_host


def prewarm_roles(entries: list[WarmEntry]) -> dict[str, str]:
    """Each host's part in pre-warming its fingerprint, for the hosts of one run in inventory
    order: ``host`` (host scope: it compiles what it lacks), ``warm`` (it serves what it has),
    ``build`` (the build host compiles only, and its cache goes to the store), ``seed`` (the
    first cold host where no build host is: it compiles only, its cache goes to the store, then
    it gets the copy as the others do), ``copy`` (gets the store's copy before its servers
    start; a missing or bad copy: it compiles). A warm host's cache is never a source: its
    servers ran model code and took prompts (#31 finding 5).

    + entries: the run's hosts, in inventory order
    """
    roles: dict[str, str] = {}
    sources: set[str] = set()
    fleet = [e for e in entries if e.fleet and e.fingerprint]
    for e in entries:
        if e not in fleet:
            roles[e.host] = "host"
    for e in sorted(fleet, key=lambda e: not e.builder):  # a build host first
        fp = str(e.fingerprint)
        if e.warm or (e.builder and (e.kept or fp in sources)):
            roles[e.host] = "warm"
        elif e.kept or fp in sources:
            roles[e.host] = "copy"
        else:
            roles[e.host] = "build" if e.builder else "seed"
            sources.add(fp)
    return roles
