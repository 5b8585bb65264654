"""What a host's fetched models and sealed compile caches hold, against what root recorded
(#36). Runs ON THE HOST, as root, stdlib only: the model fetcher records a model's files when
it fetches it (:func:`snapshot_files`, :func:`write_record`); the probe, when asked
(``serve_verify``, ``status --verify``), reads every file of each wanted model and of each warm
cache and compares (:func:`verify_model`, :func:`verify_cache`; it carries this module inline);
``warm_state.py drop`` drops a cache that differs from its seal.

A model is ``$HF_HOME/hub/models--ORG--NAME/snapshots/<rev>/`` (the revision its
``.servefleet-complete`` names), each file a regular file or a link to a blob in the model's own
directory (``../../blobs/<name>``, as the hub lays its cache out). The hub is the serve user's
tree (it can rename anything there and plant links), so every file is reached through directory
descriptors opened with ``O_NOFOLLOW``: a link is read, never followed, and resolved here inside
the model's directory (leading ``..``, then names, each a real directory, the last a regular
file); a link out of it, through another link, or to anything but a regular file is a
difference, never read. What a file holds is held to:

- root's record, written when the model was fetched, from root's own staging copy before it
  was given to the serve user: each file's size and sha256, in root's own directory of the hub
  (:data:`RECORDS`, read through ``trusted``: what the serve user put in its place never counts);
- without a record (a model fetched before #36), its blob's name when that is a digest, as the
  hub names blobs: 64 hex digits the sha256 of the content (an LFS file), 40 the git blob sha1
  (of ``blob <size>\\0`` + the content). A file with neither is counted as unchecked.

A cache is the directories its warm marker names (``rbln/<model>/<sig>``), each file against the
marker's seal (its size and sha256 when the compile ended: ``warm_state.cache_seal``), walked
the same way; a cache holds no link.

Each check returns ``{"files": N, "bytes": B, "unchecked": U, "differ": [lines]}``: the files it
read and hashed, those it had nothing to hold to, and one line per file that differs (at most
:data:`LIMIT`, the rest counted); a cache whose marker has no seal, ``"unsealed": true`` too.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from typing import Any

if __package__:  # the controller imports this module (servefleet.base.remote.content_check)
    from servefleet.base.remote import layout, trusted
else:  # on the host, next to layout.py and trusted.py (the probe carries all three)
    import layout  # type: ignore[no-redef]
    import trusted  # type: ignore[no-redef]

RECORDS = "servefleet-models"  # root's own directory in $HF_HOME/hub: models--ORG--NAME records
LIMIT = 20  # file lines a check reports; the rest are counted
MAX_RECORD = 64 << 20  # bytes of one record read
BLOCK = 1 << 20
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a fifo never blocks
SHA256 = re.compile(r"[0-9a-f]{64}")  # an LFS blob's name
SHA1 = re.compile(r"[0-9a-f]{40}")  # a git blob's name, and a snapshot's revision


def repo_dir(model: str) -> str:
    """``models--ORG--NAME``: the directory of ``model`` under ``$HF_HOME/hub``."""
    return "models--" + model.replace("/", "--")


class Walk:
    """What a walk found: ``files`` (path -> [size, sha256]), ``problems`` (path -> why it was not
    read), ``blobs`` (path -> the digest-named blob it links to, and whether its content is
    that digest), ``bytes`` read."""

    def __init__(self, sink: Callable[[str], int | None] | None = None) -> None:
        self.files: dict[str, list[Any]] = {}
        self.problems: dict[str, str] = {}
        self.blobs: dict[str, tuple[str, bool]] = {}
        self.bytes = 0
        self.sink = sink  # rel -> a new file's descriptor (None: none): what is read goes there too


def open_dirs(fd: int, parts: list[str], make: int | None = None) -> int:
    """A descriptor of the directory ``parts`` below ``fd``, each component opened without
    following a link (no exception, not even root's own links: OSError); with ``make`` (a mode,
    in root's own tree only), each made when missing and given that mode."""
    here = os.dup(fd)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise OSError(errno.EINVAL, f"{part!r} is not a name")
            if make is not None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, make, dir_fd=here)
            nxt = os.open(part, trusted.DIR_FLAGS, dir_fd=here)
            os.close(here)
            here = nxt
            if make is not None:
                os.fchmod(here, make)
        return here
    except BaseException:
        os.close(here)
        raise


def _hash(f: int, blob: str | None, out: Walk, rel: str) -> None:
    """Read the open file ``f`` (``rel``) whole: its size and sha256 (and, when it is the blob
    ``blob`` of a digest's name, whether its content is that digest)."""
    size = os.fstat(f).st_size
    sha256 = hashlib.sha256()
    git = (hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
           if blob and SHA1.fullmatch(blob) else None)  # fmt: skip
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    read = 0
    dst = out.sink(rel) if out.sink is not None else None
    try:
        while True:
            n = os.readv(f, [buf])
            if not n:
                break
            sha256.update(view[:n])
            if git is not None:
                git.update(view[:n])
            read += n
            left = view[:n]
            while dst is not None and left:
                left = left[os.write(dst, left) :]
    finally:
        if dst is not None:
            os.close(dst)
    out.files[rel] = [read, sha256.hexdigest()]
    out.bytes += read
    if blob and SHA256.fullmatch(blob):
        out.blobs[rel] = (blob, sha256.hexdigest() == blob)
    elif blob and git is not None:
        out.blobs[rel] = (blob, read == size and git.hexdigest() == blob)


def _read_open(dirfd: int, name: str, rel: str, blob: str | None, out: Walk, why: str) -> None:
    """Open ``name`` in ``dirfd`` (no link followed) and hash it; what is not a regular file is
    a problem (``why``: how to say it)."""
    try:
        f = os.open(name, FILE_FLAGS, dir_fd=dirfd)
    except OSError as e:
        out.problems[rel] = (
            f"{why}, itself a link" if e.errno == errno.ELOOP
            else f"{why}, which is missing" if e.errno == errno.ENOENT
            else f"{why}, which cannot be read ({e.strerror})"
        )  # fmt: skip
        return
    try:
        if not stat.S_ISREG(os.fstat(f).st_mode):
            out.problems[rel] = f"{why}, not a regular file"
            return
        _hash(f, blob, out, rel)
    finally:
        os.close(f)


def _link(top: int, target: str, here: list[str]) -> list[str] | str:
    """The path below ``top`` that a link in ``here`` (its directory below ``top``) to ``target``
    names, or why it names none there: leading ``..`` only (the link's own directories, each a
    real one), then names."""
    outside = "outside its model's directory"
    if target.startswith("/"):
        return outside
    parts = [p for p in target.split("/") if p not in ("", ".")]
    at = list(here)
    while parts and parts[0] == "..":
        if not at:
            return outside
        at.pop()
        parts.pop(0)
    if not parts or ".." in parts:
        return "not to a file of its model's directory"
    return at + parts


def _walk(top: int, dirfd: int, here: list[str], shown: str, links: bool, out: Walk) -> None:
    """Every entry under ``dirfd`` (``here`` below ``top``; shown as ``shown/...``), in order."""
    for name in sorted(os.listdir(dirfd)):
        rel = f"{shown}/{name}" if shown else name
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # gone while it was walked
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, trusted.DIR_FLAGS, dir_fd=dirfd)
            except OSError as e:
                out.problems[rel] = f"cannot be opened ({e.strerror})"
                continue
            try:
                _walk(top, sub, [*here, name], rel, links, out)
            finally:
                os.close(sub)
        elif stat.S_ISLNK(st.st_mode) and links:
            target = os.readlink(name, dir_fd=dirfd)
            why = f"links to {target}"
            path = _link(top, target, here)
            if isinstance(path, str):
                out.problems[rel] = f"{why}, {path}"
                continue
            try:
                parent = open_dirs(top, path[:-1])
            except OSError:
                out.problems[rel] = f"{why}, through a link or a missing directory"
                continue
            try:
                _read_open(parent, path[-1], rel, path[-1], out, why)
            finally:
                os.close(parent)
        elif stat.S_ISREG(st.st_mode):
            _read_open(dirfd, name, rel, None, out, "is a file")
        else:
            out.problems[rel] = "is a link" if stat.S_ISLNK(st.st_mode) else (
                "is not a regular file")  # fmt: skip


def snapshot_files(repofd: int, rev: str) -> Walk:
    """Every file of ``snapshots/<rev>/`` in the model directory ``repofd``, read and hashed
    (links resolved inside the model's directory only; OSError when the snapshot is not a
    directory reached without a link)."""
    if not SHA1.fullmatch(rev):
        raise OSError(errno.EINVAL, f"{rev!r} is not a revision")
    snap = open_dirs(repofd, ["snapshots", rev])
    out = Walk()
    try:
        _walk(repofd, snap, ["snapshots", rev], "", True, out)
    finally:
        os.close(snap)
    return out


def _read_small(fd: int, name: str, limit: int) -> bytes | None:
    """The regular file ``name`` in ``fd`` (no link followed), or None."""
    try:
        f = os.open(name, FILE_FLAGS, dir_fd=fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(f).st_mode):
            return None
        data = b""
        while len(data) <= limit:
            block = os.read(f, BLOCK)
            if not block:
                break
            data += block
        return data if len(data) <= limit else None
    finally:
        os.close(f)


def marker_revision(repofd: int) -> str | None:
    """The revision the model directory ``repofd``'s ``.servefleet-complete`` names (40 hex),
    read by :func:`_read_small` (a link or a fifo there is no marker, and is never waited on);
    None when there is no such marker."""
    marker = _read_small(repofd, layout.MODEL_COMPLETE, 256)
    rev = (marker or b"").decode("ascii", "replace").strip()
    return rev if SHA1.fullmatch(rev) else None


def complete_revision(hf_home: str, model: str) -> str | None:
    """The revision of ``model`` complete in ``$HF_HOME/hub``: the one its marker names
    (:func:`marker_revision`) when ``snapshots/<rev>`` is a directory there; None otherwise.
    Everything is reached through descriptors, no link followed (the hub from ``/`` by
    ``trusted.open_path``): the serve user owns the hub."""
    try:
        hub = trusted.open_path(os.path.join(hf_home, "hub"))
    except OSError:
        return None
    try:
        repo = open_dirs(hub, [repo_dir(model)])
    except OSError:
        return None
    finally:
        os.close(hub)
    try:
        rev = marker_revision(repo)
        if rev is not None:
            os.close(open_dirs(repo, ["snapshots", rev]))
        return rev
    except OSError:
        return None
    finally:
        os.close(repo)


def write_record(hubfd: int, top: str, rev: str, files: dict[str, list[Any]]) -> None:
    """Root's record of the model ``top`` (``models--ORG--NAME``) in the hub ``hubfd``: its
    revision and each file's [size, sha256], in root's own :data:`RECORDS` directory."""
    fd = trusted.root_dir(hubfd, RECORDS, create=True)
    assert fd is not None
    try:
        doc = {"revision": rev, "files": files}
        trusted.write(fd, top, json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
    finally:
        os.close(fd)


def read_record(hubfd: int, top: str, rev: str) -> dict[str, list[Any]] | None:
    """The files root recorded for the model ``top`` at revision ``rev`` (None: no record of
    it, another revision's, or one that does not parse)."""
    fd = trusted.root_dir(hubfd, RECORDS)
    if fd is None:
        return None
    try:
        data = _read_small(fd, top, MAX_RECORD)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data) if data is not None else None
    except ValueError:
        return None
    files = doc.get("files") if isinstance(doc, dict) and doc.get("revision") == rev else None
    return files if isinstance(files, dict) else None


def _capped(lines: list[str], limit: int) -> list[str]:
    return lines[:limit] + (
        [f"... and {len(lines) - limit} more file(s)"] if len(lines) > limit else []
    )


def _result(walk: Walk, lines: list[str], unchecked: int, limit: int) -> dict[str, Any]:
    return {"files": len(walk.files), "bytes": walk.bytes, "unchecked": unchecked,
            "differ": _capped(lines, limit)}  # fmt: skip


def _differ(rel: str, have: list[Any] | None, want: list[Any] | None, when: str) -> str | None:
    """How the file ``rel`` as read (``have``: [size, sha256]) differs from ``want`` (``when``:
    "fetched", "sealed")."""
    if want is None:
        return f"{rel} was not {when} (it was added since)"
    if have is None:
        return f"{rel} is missing"
    if have[0] != want[0]:
        return f"{rel} has {have[0]} bytes, {when} with {want[0]}"
    if have[1] != want[1]:
        return f"{rel} differs from the sha256 it was {when} with"
    return None


def verify_model(hf_home: str, model: str, limit: int = LIMIT) -> dict[str, Any]:
    """Every file of the snapshot the model's marker names, read and held to root's record of
    its fetch, else to its blob's digest-name (see above)."""
    top = repo_dir(model)
    empty = Walk()
    try:
        hub = trusted.open_path(os.path.join(hf_home, "hub"))
    except OSError:
        return _result(empty, [f"{hf_home}/hub is not a directory reached without a link"], 0,
                       limit)  # fmt: skip
    try:
        try:
            repo = open_dirs(hub, [top])
        except OSError:
            return _result(empty, [f"{top} is not a directory (a link?)"], 0, limit)
        try:
            rev = marker_revision(repo)
            if rev is None:
                return _result(empty, [f"{layout.MODEL_COMPLETE} names no snapshot"], 0, limit)
            record = read_record(hub, top, rev)
            try:
                walk = snapshot_files(repo, rev)
            except OSError:
                return _result(empty, [f"snapshots/{rev} is not a directory (a link?)"], 0, limit)
        finally:
            os.close(repo)
    finally:
        os.close(hub)
    lines, unchecked = [], 0
    for rel in sorted(set(walk.files) | set(walk.problems) | set(record or ())):
        if rel in walk.problems:
            lines.append(f"{rel} {walk.problems[rel]}")
            continue
        if record is not None:
            line = _differ(rel, walk.files.get(rel), record.get(rel), "fetched")
        elif rel in walk.blobs:
            blob, same = walk.blobs[rel]
            line = None if same else f"{rel} differs from the digest its blob is named by ({blob})"
        else:
            line, unchecked = None, unchecked + 1  # a plain file, and nothing recorded
        if line:
            lines.append(line)
    return _result(walk, lines, unchecked, limit)


class NotStaged(Exception):
    """A model the compile-only build cannot be given (one line: which file, and why)."""


def stage_model(hf_home: str, model: str, dest: int) -> str:
    """Copy ``model``'s complete snapshot from the serve user's ``$HF_HOME/hub`` into root's own
    hub ``dest`` (an empty directory root made), for the compile-only build to read (#46 item 2):
    ``models--ORG--NAME/refs/main`` and ``snapshots/<rev>/``, each file a regular file (root's,
    0644) holding the bytes that were read and hashed, held to root's record of the model's fetch.
    A file the record does not name is left behind (what the serve user added is never copied);
    one that differs from it, is missing or is not reached without leaving the model's directory
    raises NotStaged, as does a model without a record. Returns the revision staged.

    + hf_home: the serve user's HF_HOME
    + model: ``org/name``
    + dest: root's own hub directory (``HF_HOME/hub`` of the build)
    """
    top = repo_dir(model)
    try:
        hub = trusted.open_path(os.path.join(hf_home, "hub"))
    except OSError:
        raise NotStaged(
            f"{model}: {hf_home}/hub is not a directory reached without a link"
        ) from None
    try:
        try:
            repo = open_dirs(hub, [top])
        except OSError:
            raise NotStaged(f"{model}: {top} is not a directory (a link?)") from None
        try:
            rev = marker_revision(repo)
            record = read_record(hub, top, rev) if rev is not None else None
            if rev is None or record is None:
                raise NotStaged(
                    f"{model}: no record of root's fetch of the revision its "
                    f"{layout.MODEL_COMPLETE} names; fetch it again (delete the model directory)"
                )
            snap_out = open_dirs(dest, [top, "snapshots", rev], make=0o755)
            try:
                walk = Walk(lambda rel: _created(snap_out, rel) if rel in record else None)
                try:
                    snap = open_dirs(repo, ["snapshots", rev])
                except OSError:
                    raise NotStaged(
                        f"{model}: snapshots/{rev} is not a directory (a link?)"
                    ) from None
                try:
                    _walk(repo, snap, ["snapshots", rev], "", True, walk)
                finally:
                    os.close(snap)
            finally:
                os.close(snap_out)
        finally:
            os.close(repo)
    finally:
        os.close(hub)
    lines = [f"{rel} {walk.problems[rel]}" for rel in sorted(walk.problems) if rel in record]
    lines += [line for rel in sorted(record)
              if rel not in walk.problems
              and (line := _differ(rel, walk.files.get(rel), record[rel], "fetched"))]  # fmt: skip
    if lines:
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        raise NotStaged(f"{model}: {lines[0]}{more}; fetch it again (delete the model directory)")
    refs = open_dirs(dest, [top, "refs"], make=0o755)
    try:
        trusted.write(refs, "main", rev)
    finally:
        os.close(refs)
    return rev


def _created(base: int, rel: str) -> int:
    """A new file ``rel`` below root's own ``base`` (its directories made), root's, 0644."""
    *dirs, name = rel.split("/")
    parent = open_dirs(base, dirs, make=0o755)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        f = os.open(name, flags, 0o644, dir_fd=parent)
        os.fchmod(f, 0o644)
        return f
    finally:
        os.close(parent)


def cache_record(cache_root: str, fingerprint: str) -> dict[str, Any] | None:
    """The warm marker of ``fingerprint`` in root's own directory of the cache root (None: not
    warm here)."""
    fd = trusted.root_dir_in(cache_root, layout.WARM_DIR)
    if fd is None:
        return None
    try:
        record = json.loads(trusted.read(fd, fingerprint))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return record if isinstance(record, dict) else None


def verify_cache(cache_root: str, record: dict[str, Any], limit: int = LIMIT) -> dict[str, Any]:
    """Every file of the directories a warm marker names, read and held to its seal. A marker
    without a seal (the cache was no plain tree when its compile ended) holds nothing to check."""
    seal, dirs = record.get("seal"), record.get("dirs")
    walk = Walk()
    if not isinstance(seal, dict) or not isinstance(dirs, list):
        return _result(walk, [], 0, limit) | {"unsealed": True}
    cache = trusted.open_dir(cache_root)
    if cache is None:
        return _result(walk, [f"{cache_root} is not a directory reached without a link"], 0,
                       limit)  # fmt: skip
    gone = []
    try:
        for d in dirs:
            try:
                fd = open_dirs(cache, str(d).split("/"))
            except OSError:
                gone.append(str(d))
                continue
            try:
                _walk(cache, fd, [], str(d), False, walk)
            finally:
                os.close(fd)
    finally:
        os.close(cache)
    lines = [f"{d} is missing, or not a directory (a link?)" for d in gone]
    for rel in sorted(set(walk.files) | set(walk.problems) | set(seal)):
        if any(rel.startswith(f"{d}/") for d in gone):
            continue  # said by its directory's line
        if rel in walk.problems:
            lines.append(f"{rel} {walk.problems[rel]}")
            continue
        line = _differ(rel, walk.files.get(rel), seal.get(rel), "sealed")
        if line:
            lines.append(line)
    return _result(walk, lines, 0, limit)
