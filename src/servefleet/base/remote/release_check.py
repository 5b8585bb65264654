"""What a release holds, against what it was installed with (#36). Runs ON THE HOST, as root,
stdlib only; the installer, the probe and the converge import it (the probe carries it inline).

At install (:func:`manifest`), after every check passed, the release's marker records:

- each distribution's canonical name, version, its ``*.dist-info`` directory, and the sha256,
  file count and bytes of its wheel ``RECORD`` (every file the wheel installed, with its sha256
  and size);
- the files whose size or sha256 on disk is not their ``RECORD``'s, as installed (uv rewrites
  a console script's ``#!python`` line after the wheel's RECORD says its size): their real size
  and sha256, which the checks then hold them to;
- every directory that holds a listed file, with its mtime (ns) and which distributions list
  files there.

Then :func:`drift`, on every probe, stats every recorded directory (a file removed, added or
renamed changes its directory's mtime; an edit by ``sed -i`` or an installer is a rename) and
the site-packages' ``*.dist-info`` names: a few thousand ``lstat`` calls for vLLM with torch.
Only in a directory whose mtime changed are its listed files looked at (each there as a
regular file of its size, no link on the way), and a changed ``*.dist-info`` is read again (its
version, its RECORD's digest). Root's ``__pycache__`` writes change a directory's mtime and
nothing else: no drift. :func:`verify`, when asked (``status --verify``), reads every listed
file and compares its sha256. Both return one line per difference.

What a unit's main process runs against its files: :func:`older_than_release` (started before
its release was installed), and :func:`env_file_value` (the value systemd gives a variable from
the unit's ``EnvironmentFile=`` files: the servers' API key, which ``systemd_units``, the probe
and the health gate all read through it, as systemd does).
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
from collections.abc import Iterable
from typing import Any

MAX_RECORD = 16 << 20  # bytes of one RECORD read
LIMIT = 20  # file lines a check reports; the rest are counted


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


def _dist_infos(release: str) -> list[str]:
    return [d for site in site_packages(release)
            for d in sorted(glob.glob(os.path.join(site, "*.dist-info")))]  # fmt: skip


def _dist(release: str, dist_info: str) -> tuple[str, dict[str, Any]]:
    """One distribution as it is now: its canonical name and version, RECORD digest, files."""
    meta = _metadata(dist_info)
    raw = _read(os.path.join(dist_info, "RECORD"))
    rel = os.path.relpath(dist_info, release)
    if meta is None or raw is None:
        name = os.path.basename(dist_info)[: -len(".dist-info")].split("-", 1)[0]
        return canonical(name), {"version": None, "record": None, "dir": rel}
    rows = _record(raw)
    return canonical(meta[0]), {
        "version": meta[1],
        "record": hashlib.sha256(raw).hexdigest(),
        "files": len(rows),
        "bytes": sum(int(r[2]) for r in rows if r[2].isdigit()),
        "dir": rel,
        "meta": _stamp(dist_info),
    }


def _stamp(dist_info: str) -> list[Any]:
    """Its METADATA's and RECORD's size and mtime (ns): an edit in place changes them."""
    out: list[Any] = []
    for name in ("METADATA", "RECORD"):
        try:
            st = os.lstat(os.path.join(dist_info, name))
            out += [st.st_size, st.st_mtime_ns]
        except OSError:
            out += [None, None]
    return out


def _listed(release: str, dist_dir: str) -> list[tuple[str, str, str, str]]:
    """The files a distribution's RECORD lists: (path in the release, absolute path, hash,
    size)."""
    dist_info = os.path.join(release, dist_dir)
    site = os.path.dirname(dist_info)
    out = []
    for path, digest, size in _record(_read(os.path.join(dist_info, "RECORD")) or b""):
        full = os.path.normpath(os.path.join(site, path))
        out.append((os.path.relpath(full, release), full, digest, size))
    return out


def _digest(full: str) -> str | None:
    """A file's sha256 as a RECORD writes it (``sha256=`` + urlsafe base64, no padding)."""
    h = hashlib.sha256()
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def _mtime(path: str) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_mtime_ns if stat.S_ISDIR(st.st_mode) else None


def manifest(release: str) -> dict[str, Any]:
    """What the marker records at install (``dists``, ``rewritten``, ``dirs``: see above)."""
    dists: dict[str, dict[str, Any]] = {}
    rewritten: dict[str, list[Any]] = {}
    dirs: dict[str, set[str]] = {}
    for dist_info in _dist_infos(release):
        name, dist = _dist(release, dist_info)
        dists[name] = dist
        if dist["record"] is None:
            continue
        for shown, full, _, size in _listed(release, dist["dir"]):
            dirs.setdefault(os.path.relpath(os.path.dirname(full), release), set()).add(name)
            try:
                st = os.lstat(full)
            except OSError:
                continue  # a listed file the install did not leave: drift from the start
            if size.isdigit() and st.st_size != int(size):  # rewritten by the installer
                rewritten[shown] = [st.st_size, _digest(full)]
    return {
        "dists": dists,
        "rewritten": rewritten,
        "dirs": {d: [_mtime(os.path.join(release, d)), sorted(n)] for d, n in sorted(dirs.items())},
    }


def _inside(release: str, full: str, plain: set[str]) -> bool:
    """``full`` lies in the release with no symbolic link on the way there (``plain``: the
    directories found to be no link so far)."""
    root = os.path.normpath(release)
    if os.path.commonpath([root, full]) != root:
        return False
    here = os.path.dirname(full)
    while here != root and here not in plain:
        if os.path.islink(here):
            return False
        plain.add(here)
        here = os.path.dirname(here)
    return True


def _file_problem(release: str, full: str, size: int | None, plain: set[str]) -> str | None:
    if not _inside(release, full, plain):
        return "is outside the release or behind a link"
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if size is not None and st.st_size != size:
        return f"has {st.st_size} bytes, installed {size}"
    return None


def _want(
    shown: str, digest: str, size: str, rewritten: dict[str, list[Any]]
) -> tuple[int | None, str]:
    """The size and sha256 a listed file must have: its RECORD's, or as the installer left it."""
    if shown in rewritten:
        return rewritten[shown][0], rewritten[shown][1] or ""
    return (int(size) if size.isdigit() else None), digest


def _capped(lines: list[str], limit: int) -> list[str]:
    return lines[:limit] + (
        [f"... and {len(lines) - limit} more file(s)"] if len(lines) > limit else []
    )


def drift(release: str, marker: dict[str, Any] | None, limit: int = LIMIT) -> list[str]:
    """How the release differs from what its marker recorded (one line each, at most ``limit``
    file lines); empty when it is what was installed. A marker from before #36 (no ``dists``)
    records nothing to compare: no drift."""
    if not isinstance(marker, dict) or not isinstance(marker.get("dists"), dict):
        return []
    recorded: dict[str, dict[str, Any]] = marker["dists"]
    rewritten = marker.get("rewritten") or {}
    by_dir = {d["dir"]: n for n, d in recorded.items() if isinstance(d, dict) and "dir" in d}
    now_dirs = {os.path.relpath(d, release) for d in _dist_infos(release)}
    out = []
    for gone in sorted(set(by_dir) - now_dirs):
        name = by_dir[gone]
        out.append(f"{name} {recorded[name].get('version')}: not installed any more")
    for new in sorted(now_dirs - set(by_dir)):
        name, dist = _dist(release, os.path.join(release, new))
        out.append(f"{name} {dist['version']}: installed since (not by servefleet)")
    changed = [d for d, (mtime, _) in (marker.get("dirs") or {}).items()
               if _mtime(os.path.join(release, d)) != mtime]  # fmt: skip
    restamped = [d for d in sorted(now_dirs & set(by_dir)) if d not in changed
                 and _stamp(os.path.join(release, d)) != recorded[by_dir[d]].get("meta")]  # fmt: skip
    for d in [*changed, *restamped]:
        # a dist-info that changed: its version and RECORD again
        owner = by_dir.get(d)
        if owner and d in now_dirs:
            _, have = _dist(release, os.path.join(release, d))
            name, want = owner, recorded[owner]
            if have["version"] != want.get("version"):
                out.append(f"{name}: version {have['version']}, installed {want.get('version')}")
            elif have["record"] != want.get("record"):
                out.append(f"{name} {want.get('version')}: its RECORD changed")
            elif have.get("meta") != want.get("meta"):
                out.append(f"{name} {want.get('version')}: its METADATA changed")
    files: list[str] = []
    plain: set[str] = set()
    owners = {d: set(names) for d, (_, names) in (marker.get("dirs") or {}).items()}
    for d in changed:
        for name in sorted(owners.get(d, ())):
            dist = recorded.get(name) or {}
            if dist.get("dir") not in now_dirs:
                continue
            for shown, full, digest, size in _listed(release, dist["dir"]):
                if os.path.relpath(os.path.dirname(full), release) != d:
                    continue
                why = _file_problem(release, full, _want(shown, digest, size, rewritten)[0], plain)
                if why:
                    files.append(f"{name}: {shown} {why}")
    return out + _capped(files, limit)


def verify(release: str, marker: dict[str, Any] | None, limit: int = LIMIT) -> dict[str, Any]:
    """Every file each RECORD lists, read and hashed: ``{"files": N, "bytes": B, "differ":
    [lines]}`` (a file whose sha256 is not what was installed, or :func:`drift`'s reasons)."""
    if not isinstance(marker, dict) or not isinstance(marker.get("dists"), dict):
        return {"files": 0, "bytes": 0, "differ": []}  # a marker before #36: nothing to hold
    rewritten = marker.get("rewritten") or {}
    files = read = 0
    differ = [line for line in drift(release, marker, limit) if ": " in line
              and not line.startswith("...")]  # fmt: skip
    plain: set[str] = set()
    checked = []
    for dist_info in _dist_infos(release):
        name, dist = _dist(release, dist_info)
        if dist["record"] is None:
            differ.append(f"{name}: no readable METADATA or RECORD")
            continue
        for shown, full, digest, size in _listed(release, dist["dir"]):
            want_size, want_digest = _want(shown, digest, size, rewritten)
            why = _file_problem(release, full, want_size, plain)
            if why is None and want_digest.startswith("sha256="):
                files += 1
                read += os.lstat(full).st_size
                if _digest(full) != want_digest:
                    why = "differs from the sha256 it was installed with"
            if why:
                checked.append(f"{name}: {shown} {why}")
    seen = set(differ)
    differ += [x for x in checked if x not in seen]
    return {"files": files, "bytes": read, "differ": _capped(differ, limit)}


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


def mtime(path: str) -> float | None:
    """When ``path`` was last written (None: it is not there)."""
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return None


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


ENV_NEWLINE = "\n\r"  # systemd's NEWLINE: a CR ends a line too (CRLF: a line, then an empty one)
ENV_WHITESPACE = " \t\n\r"
ENV_DQ_ESCAPES = '"\\`$'  # what a backslash in double quotes gives as itself (SHELL_NEED_ESCAPE)


def _trim(text: str, at: int) -> str:
    return text[:at] if at >= 0 else text


def _blanks(at: int, c: str, text: str) -> int:
    """Where ``text``'s trailing blanks begin once ``c`` is added to it (-1: none)."""
    return -1 if c not in ENV_WHITESPACE else at if at >= 0 else len(text)


def env_assignments(text: str) -> list[tuple[str, str]]:
    """The ``NAME=value`` assignments of an ``EnvironmentFile=``'s text, in order, as systemd
    reads them (src/basic/env-file.c ``parse_env_file_internal``, whose states these are): a line
    ends at LF or CR; blank lines, lines whose first non-blank character is ``#`` or ``;``, and
    lines without ``=`` assign nothing; blanks around the name, after the ``=`` and at the end of
    an unquoted value are dropped; ``'...'`` is taken as it is, ``"..."`` with ``\\"``,
    ``\\\\``, ``\\` `` and ``\\$`` unescaped (another backslash stays), an unquoted ``\\x`` is
    ``x``; a backslash before a line's end, or a quote still open, carries the value over the
    line's end; a quote inside an unquoted value is itself. A NUL ends the text (systemd reads it
    as a C string). Since systemd 254 a comment ends at its line's end even after a backslash
    (252, Debian 12's and RHEL 9's, carries such a comment over to the next line)."""
    found: list[tuple[str, str]] = []
    state, key, value = "pre_key", "", ""
    key_blank = value_blank = -1  # where the trailing blanks began (-1: none yet)
    for c in text.split("\0", 1)[0]:
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif c not in ENV_WHITESPACE:
                state, key, key_blank = "key", c, -1
        elif state == "key":
            if c in ENV_NEWLINE:
                state = "pre_key"  # no "=": nothing assigned
            elif c == "=":
                state, value, value_blank = "pre_value", "", -1
            else:
                key_blank, key = _blanks(key_blank, c, key), key + c
        elif state == "pre_value":
            if c in ENV_NEWLINE:
                state = "pre_key"
                found.append((_trim(key, key_blank), value))
            elif c in "'\"\\":
                state = {"'": "single", '"': "double", "\\": "escape"}[c]
            elif c not in ENV_WHITESPACE:
                state, value = "value", value + c
        elif state == "value":
            if c in ENV_NEWLINE:
                state = "pre_key"
                found.append((_trim(key, key_blank), _trim(value, value_blank)))
            elif c == "\\":
                state, value_blank = "escape", -1
            else:
                value_blank, value = _blanks(value_blank, c, value), value + c
        elif state == "escape":
            state, value = "value", value + ("" if c in ENV_NEWLINE else c)
        elif state == "single":
            state, value = ("pre_value", value) if c == "'" else ("single", value + c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value += c
        elif state == "double_escape":
            state = "double"
            value += c if c in ENV_DQ_ESCAPES else "" if c == "\n" else "\\" + c
        elif c in ENV_NEWLINE:  # comment
            state = "pre_key"
    if state not in ("pre_key", "key", "comment"):  # the text ended inside a value
        found.append(
            (_trim(key, key_blank), _trim(value, value_blank) if state == "value" else value)
        )
    return found


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a byte that was not UTF-8, kept as a lone surrogate
        return False
    return True


def env_file_value(paths: Iterable[str], name: str) -> str | None:
    """The value systemd gives ``name`` from the ``EnvironmentFile=`` files ``paths``, read in
    order (:func:`env_assignments`): the last assignment wins, across the files too; None when
    none assigns it (``NAME=`` assigns the empty value). A file that cannot be read, and one that
    systemd refuses whole (an assignment that is not UTF-8), assign nothing: systemd fails the
    unit's start on it (or passes over a ``-`` file)."""
    value = None
    for path in paths:
        try:
            with open(path, "rb") as fh:
                text = fh.read().decode("utf-8", "surrogateescape")
        except OSError:
            continue
        pairs = env_assignments(text)
        if all(_utf8(k) and _utf8(v) for k, v in pairs):
            value = next((v for k, v in reversed(pairs) if k == name), value)
    return value
