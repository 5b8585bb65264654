"""What a release holds, against what it was installed with (#36). Runs ON THE HOST, as root,
stdlib only; the installer, the probe and the converge import it (the probe carries it inline).

At install (:func:`manifest`), after every check passed, the release's marker records each
distribution's canonical name, version, and the sha256, file count and bytes of its wheel
``RECORD`` (every file the wheel installed, each with its sha256 and size). Then:

- :func:`drift`, on every probe: the distributions there now (their ``*.dist-info``: the version
  in ``METADATA`` and the ``RECORD`` digest) against the marker, and every file a ``RECORD``
  lists still there as a regular file of its recorded size (an ``lstat`` a file: a few ms for
  vLLM's ~3,000). One line per difference; none: the release is what was installed.
- :func:`verify`, when asked (``status --verify``): every listed file's sha256 against its
  ``RECORD`` line, with how many files and bytes it read.

A ``RECORD`` line without a hash (the ``RECORD`` itself, ``.pyc`` files some installers add) is
checked for existence only. Nothing here follows a link out of the release: a listed path that
resolves outside it, or through a symbolic link, is a difference.
"""

from __future__ import annotations

import base64
import csv
import glob
import hashlib
import io
import os
import re
import stat
from typing import Any

MAX_RECORD = 16 << 20  # bytes of one RECORD read


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def site_packages(release: str) -> list[str]:
    """The release venv's site-packages directories (``lib/pythonX.Y/site-packages``)."""
    return sorted(glob.glob(os.path.join(release, "lib", "python*", "site-packages")))


def _read(path: str, limit: int = MAX_RECORD) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read(limit)


def _metadata(dist_info: str) -> tuple[str, str] | None:
    """(name, version) from a dist-info's METADATA headers."""
    text = _read(os.path.join(dist_info, "METADATA"), 1 << 20)
    if text is None:
        return None
    name = version = None
    for line in text.decode("utf-8", "replace").splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        key, _, value = line.partition(":")
        if key.lower() == "name" and name is None:
            name = value.strip()
        elif key.lower() == "version" and version is None:
            version = value.strip()
    return (name, version) if name and version else None


def _record(raw: bytes) -> list[tuple[str, str, str]]:
    """A RECORD's rows: (path, hash, size), as its CSV has them."""
    rows = csv.reader(io.StringIO(raw.decode("utf-8", "replace")))
    return [(r[0], r[1], r[2]) for r in rows if len(r) >= 3 and r[0]]


def installed(release: str) -> dict[str, dict[str, Any]]:
    """Every distribution in the release now: canonical name -> version, RECORD sha256, its
    files and bytes (from the RECORD), and the dist-info directory (relative to the release)."""
    out: dict[str, dict[str, Any]] = {}
    for site in site_packages(release):
        for dist_info in sorted(glob.glob(os.path.join(site, "*.dist-info"))):
            meta = _metadata(dist_info)
            raw = _read(os.path.join(dist_info, "RECORD"))
            if meta is None or raw is None:
                name = os.path.basename(dist_info)[: -len(".dist-info")].split("-", 1)[0]
                out[canonical(name)] = {"version": None, "record": None,
                                        "dir": os.path.relpath(dist_info, release)}  # fmt: skip
                continue
            rows = _record(raw)
            out[canonical(meta[0])] = {
                "version": meta[1],
                "record": hashlib.sha256(raw).hexdigest(),
                "files": len(rows),
                "bytes": sum(int(r[2]) for r in rows if r[2].isdigit()),
                "dir": os.path.relpath(dist_info, release),
            }
    return out


def manifest(release: str) -> dict[str, dict[str, Any]]:
    """What the marker records at install: :func:`installed` without the directories."""
    return {n: {k: v for k, v in d.items() if k != "dir"} for n, d in installed(release).items()}


def _listed(release: str, dist: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The files a distribution's RECORD lists: (shown path, absolute path, hash, size)."""
    dist_info = os.path.join(release, dist["dir"])
    raw = _read(os.path.join(dist_info, "RECORD")) or b""
    site = os.path.dirname(dist_info)
    out = []
    for path, digest, size in _record(raw):
        full = os.path.normpath(os.path.join(site, path))
        out.append((os.path.relpath(full, release), full, digest, size))
    return out


def _inside(release: str, full: str) -> bool:
    """``full`` lies in the release with no symbolic link on the way there."""
    root = os.path.normpath(release)
    if os.path.commonpath([root, full]) != root:
        return False
    here = root
    for part in os.path.relpath(full, root).split(os.sep)[:-1]:
        here = os.path.join(here, part)
        if os.path.islink(here):
            return False
    return True


def drift(release: str, recorded: dict[str, dict[str, Any]] | None, limit: int = 20) -> list[str]:
    """How the release differs from what its marker recorded (one line each, at most ``limit``
    file lines); empty when it is what was installed. A marker from before #36 (None) records
    nothing to compare: no drift."""
    if recorded is None:
        return []
    now = installed(release)
    out = []
    for name in sorted(set(recorded) | set(now)):
        want, have = recorded.get(name) or {}, now.get(name)
        if have is None:
            out.append(f"{name} {want.get('version')}: not installed any more")
        elif not want:
            out.append(f"{name} {have['version']}: installed since (not by servefleet)")
        elif have["version"] != want["version"]:
            out.append(f"{name}: version {have['version']}, installed {want['version']}")
        elif have["record"] != want["record"]:
            out.append(f"{name} {want['version']}: its RECORD changed")
    files = []
    for name, dist in sorted(now.items()):
        if name not in recorded or dist["record"] is None:
            continue
        for shown, full, _digest, size in _listed(release, dist):
            why = _file_problem(release, full, size)
            if why:
                files.append(f"{name}: {shown} {why}")
    out += files[:limit]
    if len(files) > limit:
        out.append(f"... and {len(files) - limit} more file(s)")
    return out


def _file_problem(release: str, full: str, size: str) -> str | None:
    if not _inside(release, full):
        return "is outside the release or behind a link"
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if size.isdigit() and st.st_size != int(size):
        return f"has {st.st_size} bytes, installed {size}"
    return None


def _digest(full: str) -> str | None:
    h = hashlib.sha256()
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def verify(release: str, limit: int = 20) -> dict[str, Any]:
    """Every file each RECORD lists, read and hashed: ``{"files": N, "bytes": B, "differ":
    [lines]}`` (a file whose sha256 is not its RECORD's, or :func:`drift`'s reasons)."""
    files = read = 0
    differ = []
    for name, dist in sorted(installed(release).items()):
        if dist["record"] is None:
            differ.append(f"{name}: no readable METADATA or RECORD")
            continue
        for shown, full, digest, size in _listed(release, dist):
            why = _file_problem(release, full, size)
            if why is None and digest.startswith("sha256="):
                files += 1
                read += os.lstat(full).st_size
                if _digest(full) != digest:
                    why = "differs from its RECORD's sha256"
            if why:
                differ.append(f"{name}: {shown} {why}")
    more = [f"... and {len(differ) - limit} more file(s)"] if len(differ) > limit else []
    return {"files": files, "bytes": read, "differ": differ[:limit] + more}


def _unit_release(text: str) -> str | None:
    """The release directory a unit's ExecStart runs from (``.../releases/<id>``)."""
    m = re.search(r'ExecStart="?(/[^"\s]*/releases/[0-9a-f]+)/bin/', text)
    return m.group(1) if m else None


def process_started(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/stat") as fh:
            btime = next(int(x.split()[1]) for x in fh if x.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def older_than_release(pid: int, unit_text: str | None, marker: str) -> bool:
    """The unit's main process started before its release was (re)installed (the marker is
    written last): it runs files that are no longer there, and must restart onto them."""
    release = _unit_release(unit_text or "") if pid else None
    started = process_started(pid) if release else None
    try:
        installed_at = os.lstat(os.path.join(release, marker)).st_mtime if release else None
    except OSError:
        return False
    # /proc's start time is in clock ticks, btime in whole seconds: a second's slack
    return started is not None and installed_at is not None and started + 1 < installed_at
