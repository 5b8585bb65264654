#!/usr/bin/env python3
"""servefleet model fetch. Runs ON THE HOST, as root (stdlib only, python3 >= 3.10; hub downloads
run huggingface_hub inside the release venv's python).

usage: fetch_model.py MODEL HF_HOME OWNER (--store URL | --hub PYTHON [--endpoint URL] | --archive FILE)
                      [--token-file FILE] [--token-env NAME] [--revision REV] [--sha256 HEX] [--timeout SECONDS]
                      [--lock-timeout SECONDS] [--tries N] [--retry-wait SECONDS]

Lays MODEL (``ORG/NAME``) out as a Hugging Face download does, under
``$HF_HOME/hub/models--ORG--NAME``, so servers started with HF_HUB_OFFLINE=1 find it and never
download. Everything it writes there is owned by OWNER and OWNER's primary group.

Store (``--store URL``): ``<URL>/manifest.json`` is ``{"models": {"ORG/NAME": {"sha256": HEX,
"revision": REV, "path": "ORG/NAME.tar.gz"}}}`` and ``<URL>/<path>`` a tar.gz of
``models--ORG--NAME/{refs/main,snapshots/<rev>/...}``. The archive is streamed once into a
temporary file and its sha256, checked against ``--sha256`` or else the manifest, then unpacked
in a temporary directory under ``$HF_HOME/hub``, checked and moved into place. An archive with a
member outside ``models--ORG--NAME/``, a symlink resolving outside it, a hard link, a device or
fifo is refused whole. Requests time out after ``--timeout`` seconds, the wait for the hub's lock
(one fetch at a time; the serve user can hold it too) after ``--lock-timeout``; the token (read from the
0600 ``--token-file``) travels only in the Authorization header, which a redirect to another
origin (scheme, host, port) drops.

Archive (``--archive FILE``, with ``--sha256``): a local copy of a store archive (the host's
wheelhouse copy, ``sdk_source = "wheelhouse"``): its sha256 is checked, then it is unpacked and
checked as a store archive is. No network.

Hub (``--hub PYTHON``): ``snapshot_download(MODEL, revision=REV)`` in PYTHON, with
HF_TOKEN_PATH pointing at the token file, HF_ENDPOINT at ``--endpoint URL`` when given (a
mirror or a private hub; else the client's default; the host's own HF_ENDPOINT is dropped) and
HF_HOME at root's own staging directory, then checked and moved into place as an archive is: the
serve user's hub is never the client's cache, so nothing planted there redirects a write. The
client resolves HF_HOME to a real path, so it gets the staging directory bind-mounted on an empty
root-only ``/run/servefleet-fetch-*`` in a mount namespace of its own (``unshare``), never a
path through the serve user's hub.

``--revision REV`` (40 hex digits) pins a commit: the archive must hold ``snapshots/REV``
(refs/main may name another; the fetcher then points refs/main at the pinned revision, since
servers run offline and load what refs/main names). Without it the revision is the one refs/main names (store) or the
one the hub resolves.

Completeness marker (the contract the host probe reads): the LAST step of a successful fetch,
after every file is in place, owned and synced, writes
``$HF_HOME/hub/models--ORG--NAME/.servefleet-complete`` atomically (a temporary file renamed
over it), holding exactly the revision, the 40-hex commit directory under ``snapshots/`` (no
newline, like refs/main). A model counts as present iff that marker exists, names an existing
``snapshots/<rev>`` directory and, when a revision is pinned, equals it. refs/main alone proves
nothing: a download cut short leaves it behind. A failed fetch leaves an earlier copy as it was
and never a partial one: leftovers of a killed run (``$HF_HOME/hub/.fetch-*``) are removed by
the next run; runs on one host take turns (a lock on ``$HF_HOME/hub``).

Retries (``retry.py``, the controller's rule too): a request to the store, or a hub download,
that fails in a way that may pass (a connection refused or reset, a timeout, HTTP 408/425/429/5xx)
is tried again, up to ``--tries`` times in all (5), waiting ``--retry-wait`` seconds (1) and
twice as long before each next try; a refusal (401, 403, 404, a wrong sha256, an unsafe archive)
is never tried again, so its line shows once.

Every failure is one line on stderr, ``servefleet: ...``; exit 2 for bad arguments, 3 when the
store or the hub could not be reached (every try failed transiently: worth a re-run later), 1
for every other failure (refused).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import http.client
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple, NoReturn
from urllib.parse import urlsplit

if __package__:  # the controller imports this module (servefleet.remote.fetch_model)
    from servefleet.remote import layout, retry, trusted
else:  # on the host, next to layout.py, retry.py and trusted.py
    import layout  # type: ignore[no-redef]
    import retry  # type: ignore[no-redef]
    import trusted  # type: ignore[no-redef]

MARKER = layout.MODEL_COMPLETE
MODEL_RE = re.compile(r"[A-Za-z0-9._-]+/[A-Za-z0-9._-]+")
REVISION_RE = re.compile(r"[0-9a-f]{40}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
STORE_PATH_RE = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
TOKEN_RE = re.compile(r"[\x21-\x7e]+")  # what an HTTP header can carry, no spaces
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CHUNK = 1 << 20
MANIFEST_LIMIT = 16 << 20
MAX_LINK_HOPS = 40  # as the kernel's MAXSYMLINKS
DATA_FILTER = hasattr(tarfile, "data_filter")  # 3.12, and the 3.10.12/3.11.4 backports
FILTER_ERROR: Any = getattr(tarfile, "FilterError", ())  # nothing to catch before them
DEFAULT_PORTS = {"http": 80, "https": 443}


class Refusal(Exception):
    """One line for stderr (without the ``servefleet: `` prefix) and the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def bad_model_id(model: str) -> str | None:
    """Why model is not a model id ``ORG/NAME`` of ``[A-Za-z0-9._-]`` without ``..``, or None.

    + model: the id to check
    """
    if not MODEL_RE.fullmatch(model) or ".." in model:
        return f"{model!r} is not a model id ORG/NAME of [A-Za-z0-9._-] (no '..')"
    return None


def repo_dir_name(model: str) -> str:
    """``models--ORG--NAME``: the directory of model under ``$HF_HOME/hub``."""
    return "models--" + model.replace("/", "--")


# --- HTTP ----------------------------------------------------------------------------------------
def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = -1
    return scheme, (parts.hostname or "").lower(), port


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but never carries the Authorization header to another origin."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(new.full_url) != _origin(req.full_url):
            new.remove_header("Authorization")
        return new


def could_not_reach(what: str, why: str, gave_up: retry.GaveUp) -> Refusal:
    """The line (exit 3) for ``what`` that every try failed to reach, ``why`` the last time.

    + what: a URL, the hub
    + why: the last failure, in a few words
    + gave_up: the tries
    """
    return Refusal(
        f"could not reach {what}: {why} ({retry.tried(gave_up.tries, gave_up.seconds)}); "
        "worth a re-run later",
        code=retry.UNREACHABLE_EXIT,
    )


class Client:
    """GETs with a timeout and the store token, each tried again after a transient failure
    (:func:`retry.attempts`); every failure becomes one Refusal line, exit 3 when the store
    could not be reached.

    + token: the bearer token, or None
    + token_env: the controller's variable the token comes from (named on 401/403)
    + timeout: seconds for each connect and each read
    + tries: the most tries of each request
    + retry_wait: seconds before the second try (doubled before each next one)
    """

    def __init__(
        self,
        token: str | None,
        token_env: str | None,
        timeout: float,
        tries: int = retry.TRIES,
        retry_wait: float = retry.FIRST_WAIT,
    ) -> None:
        self.token = token
        self.token_env = token_env
        self.timeout = timeout
        self.tries = tries
        self.retry_wait = retry_wait
        self.opener = urllib.request.build_opener(_Redirects)

    def _why(self, exc: BaseException) -> str:
        inner = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(inner, TimeoutError):
            return f"no answer within {self.timeout:g} s"
        return retry.reason(exc)

    @contextlib.contextmanager
    def _errors(self, url: str, not_found: str) -> Iterator[None]:
        try:
            yield
        except retry.GaveUp as gave_up:
            raise could_not_reach(url, self._why(gave_up.last), gave_up) from None
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404:
                raise Refusal(not_found) from None
            if exc.code in (401, 403):
                hint = (
                    f"check the {self.token_env} environment variable on the controller"
                    if self.token_env
                    else "the store wants a valid token (--token-file)"
                )
                raise Refusal(f"{url} answered {exc.code}; {hint}") from None
            raise Refusal(f"{url} answered {exc.code} {exc.reason}") from None
        except TimeoutError:
            raise Refusal(f"{url}: no answer within {self.timeout:g} s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise Refusal(f"{url}: no answer within {self.timeout:g} s") from None
            raise Refusal(f"cannot fetch {url}: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise Refusal(f"fetching {url} failed: {exc!r}") from None

    def _open(self, url: str) -> Any:
        request = urllib.request.Request(url)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        return self.opener.open(request, timeout=self.timeout)

    def read(self, url: str, not_found: str, limit: int) -> bytes:
        """The body of url (at most limit bytes)."""

        def once() -> bytes:
            with self._open(url) as response:
                data = bytes(response.read(limit + 1))
                if len(data) <= limit:
                    retry.check_whole(response)
                return data

        with self._errors(url, not_found):
            data = retry.attempts(once, self.tries, self.retry_wait)
        if len(data) > limit:
            raise Refusal(f"{url} is larger than {limit} bytes")
        return data

    def download(self, url: str, out: IO[bytes], not_found: str) -> str:
        """Stream url into out (from its start again on each try); return its sha256."""

        def once() -> str:
            out.seek(0)
            out.truncate()
            digest = hashlib.sha256()
            with self._open(url) as response:
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
                retry.check_whole(response)
            return digest.hexdigest()

        with self._errors(url, not_found):
            got = retry.attempts(once, self.tries, self.retry_wait)
        return got


def store_entry(client: Client, store: str, model: str) -> dict[str, str]:
    """The store manifest's entry of model: sha256 and a safe path under the store."""
    url = f"{store}/manifest.json"
    data = client.read(
        url, f"{url} answered 404: the store publishes no manifest; give --sha256", MANIFEST_LIMIT
    )
    try:
        models = json.loads(data)["models"]
        entry = models[model] if isinstance(models, dict) else None
    except KeyError:
        entry = None
    except (ValueError, TypeError):
        raise Refusal(f"{url} is not a store manifest") from None
    if entry is None:
        raise Refusal(f"{model} is not in the store ({store})")
    sha = entry.get("sha256") if isinstance(entry, dict) else None
    path = entry.get("path", f"{model}.tar.gz") if isinstance(entry, dict) else None
    if not isinstance(sha, str) or not SHA256_RE.fullmatch(sha.lower()):
        raise Refusal(f"{url} has no sha256 for {model}")
    if not isinstance(path, str) or not STORE_PATH_RE.fullmatch(path) or ".." in path.split("/"):
        raise Refusal(f"{url} names an unsafe path for {model}: {path!r}")
    return {"sha256": sha.lower(), "path": path}


# --- archives ------------------------------------------------------------------------------------
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
        if len(parts) > 1 and parts[1].startswith(MARKER):
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
                raise Refusal(f"{url}: unsafe member {unsafe[0]!r} ({unsafe[1]})")
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
        raise Refusal(f"{url}: unsafe member {name!r} ({exc})") from None
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise Refusal(f"{url} is not a readable tar.gz ({exc})") from None
    got = dest / top
    if not got.is_dir() or got.is_symlink():
        raise Refusal(f"{url} does not hold {top}/")
    return got


def check_snapshot(repo: Path, rev: str | None, source: str) -> str:
    """The revision whose snapshot repo holds: rev, else the one refs/main names.

    + repo: the ``models--ORG--NAME`` directory
    + rev: the wanted revision, or None
    + source: where repo came from (for messages)
    """
    if rev is None:
        refs = repo / "refs" / "main"
        if not refs.is_file():
            raise Refusal(f"{source} does not hold {repo.name}/refs/main")
        rev = refs.read_text().strip()
        if not REVISION_RE.fullmatch(rev):
            raise Refusal(f"{source}: {repo.name}/refs/main does not name a commit")
    snapshot = repo / "snapshots" / rev
    if not snapshot.is_dir() or not any(snapshot.iterdir()):
        raise Refusal(f"{source} does not hold the files of {repo.name}/snapshots/{rev}")
    return rev


# --- ownership and the marker --------------------------------------------------------------------
# The hub directory is the serve user's (its servers write there): root works in it through
# directory descriptors and never follows a link, the top of a tree included (#18 finding 1).


def _open_dir(path: Path) -> int:
    """A descriptor of the real directory ``path`` (a link in its place is refused)."""
    try:
        return os.open(path, trusted.DIR_FLAGS)
    except OSError as exc:
        raise Refusal(f"{path} is not a directory ({exc.strerror}): left as it is") from None


def give(top: Path, uid: int, gid: int) -> None:
    """chown top and everything under it, through directory descriptors (``os.fwalk``): never
    following a symlink, top included (links are chowned; a link planted as top is refused)."""
    topfd = _open_dir(top)
    try:
        os.chown(topfd, uid, gid)
    finally:
        os.close(topfd)
    for _, dirnames, filenames, dirfd in os.fwalk(top, follow_symlinks=False):
        for name in dirnames + filenames:
            os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)


def point_main(repo: Path, rev: str, uid: int, gid: int) -> None:
    """refs/main names rev (atomically; the refs directory made if the hub client made none)."""
    repofd = _open_dir(repo)
    try:
        try:
            os.mkdir("refs", 0o755, dir_fd=repofd)
        except FileExistsError:
            pass
        refsfd = os.open("refs", trusted.DIR_FLAGS, dir_fd=repofd)
        try:
            os.chown(refsfd, uid, gid)
            trusted.write(refsfd, "main", rev, owner=(uid, gid))
        finally:
            os.close(refsfd)
    finally:
        os.close(repofd)


def mark_complete(repo: Path, rev: str, uid: int, gid: int) -> None:
    """Write repo/MARKER holding rev, atomically, after syncing everything written before."""
    os.sync()
    repofd = _open_dir(repo)
    try:
        trusted.write(repofd, MARKER, rev, owner=(uid, gid))
    finally:
        os.close(repofd)


LOCK_POLL = 0.2  # seconds between two tries of the hub's lock


@contextlib.contextmanager
def one_fetch_at_a_time(hub: Path, deadline: float) -> Iterator[None]:
    """Hold the lock on hub, then remove what a killed run left (``.fetch-*``). The hub is the
    serve user's, so it can hold the lock too: after ``deadline`` seconds of waiting the fetch
    fails in one line."""
    fd = os.open(hub, os.O_RDONLY | os.O_DIRECTORY)
    try:
        give_up = time.monotonic() + deadline
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= give_up:
                    raise Refusal(
                        f"{hub}: another process holds its lock (a fetch, or the serve "
                        f"user holding it); gave up after {deadline:g} s (--lock-timeout), "
                        "nothing fetched"
                    ) from None
                time.sleep(LOCK_POLL)
        for stale in hub.glob(".fetch-*"):
            shutil.rmtree(stale, ignore_errors=True)
        yield
    finally:
        os.close(fd)


class Staging(NamedTuple):
    """Root's own staging directory: its descriptor, the /proc/self/fd path of it, its name."""

    fd: int  # what a child is given (pass_fds) to work in the same directory
    path: Path  # ``/proc/self/fd/<fd>``: no rename or link planted elsewhere redirects it
    name: str  # ``.fetch-<hex>`` in the hub


@contextlib.contextmanager
def staging(hub: Path) -> Iterator[Staging]:
    """Root's own 0700 ``.fetch-*`` directory in the hub, by its descriptor (a rename or a link
    planted in its place cannot redirect the work in it); removed at the end."""
    name = f".fetch-{secrets.token_hex(8)}"
    os.mkdir(hub / name, 0o700)
    try:
        fd = os.open(hub / name, trusted.DIR_FLAGS)
    except OSError:
        raise Refusal(f"{name}: replaced while it was made; nothing fetched") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise Refusal(f"{name}: replaced while it was made; nothing fetched")
        yield Staging(fd, Path(trusted.at(fd)), name)
    finally:
        for entry in os.listdir(fd):
            trusted.remove_in(fd, entry)
        os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(hub / name)


@contextlib.contextmanager
def hub_mount() -> Iterator[str]:
    """A new empty root-only directory under /run (the hub client's mount point), removed at the
    end; /run is root's, so no other user can have put anything in its place."""
    path = HUB_MOUNT.format(secrets.token_hex(8))
    try:
        os.mkdir(path, 0o700)
    except OSError as exc:
        raise Refusal(f"cannot make {path}: {exc.strerror}") from None
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(path)


# --- sources -------------------------------------------------------------------------------------
def from_store(a: argparse.Namespace, hub: Path, client: Client, uid: int, gid: int) -> str:
    """Fetch a.model from the store into hub; return its revision."""
    store = a.store.rstrip("/")
    if a.sha256:
        want, path, said = a.sha256, f"{a.model}.tar.gz", "--sha256"
    else:
        entry = store_entry(client, store, a.model)
        want, path, said = entry["sha256"], entry["path"], "the store manifest"
    url = f"{store}/{path}"
    with staging(hub) as tmp:
        archive = tmp.path / "archive"
        with open(archive, "wb") as out:
            got = client.download(url, out, f"{a.model} is not in the store ({store})")
        if got != want:
            raise Refusal(f"{a.model}: {url} has sha256 {got}, but {said} says {want}")
        return place(a, hub, archive, tmp.path, url, uid, gid)


def from_archive(a: argparse.Namespace, hub: Path, uid: int, gid: int) -> str:
    """Unpack a.model from a local archive (a wheelhouse copy) checked against a.sha256."""
    archive = Path(a.archive)
    digest = hashlib.sha256()
    try:
        with open(archive, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                digest.update(chunk)
    except OSError as exc:
        raise Refusal(f"{a.model}: cannot read {archive}: {exc.strerror}") from None
    if digest.hexdigest() != a.sha256:
        raise Refusal(
            f"{a.model}: {archive} has sha256 {digest.hexdigest()}, but --sha256 says {a.sha256}"
        )
    with staging(hub) as tmp:
        return place(a, hub, archive, tmp.path, str(archive), uid, gid)


def place(
    a: argparse.Namespace, hub: Path, archive: Path, tmp: Path, source: str, uid: int, gid: int
) -> str:
    """Unpack a checked archive in tmp (an archive inside tmp is removed once unpacked), check
    its snapshot, give it to the owner and move it into hub; return its revision."""
    top = repo_dir_name(a.model)
    repo = unpack(archive, tmp / "unpacked", top, source)
    if archive.parent == tmp:
        archive.unlink()
    rev = check_snapshot(repo, a.revision, source)
    give(repo, uid, gid)
    move_in(hub, repo, top, tmp)
    return rev


def move_in(hub: Path, repo: Path, top: str, tmp: Path) -> None:
    """Rename the checked ``repo`` (in root's staging ``tmp``) to ``hub/top``; what was there
    goes aside into ``tmp`` (removed with it), and comes back if the rename fails."""
    target = hub / top
    old = tmp / "old"
    if target.exists() or target.is_symlink():
        os.rename(target, old)
    try:
        os.rename(repo, target)
    except OSError:
        if old.exists() or old.is_symlink():
            os.rename(old, target)
        raise


HUB_CODE = r"""
import json, sys
try:
    from huggingface_hub import snapshot_download
    path = snapshot_download(sys.argv[1], revision=sys.argv[2] or None)
except Exception as exc:  # one JSON line, never a traceback
    status = getattr(getattr(exc, "response", None), "status_code", None)
    lines = str(exc).strip().splitlines() or [""]
    chain, e = [], exc  # the error's causes: a connection error under the hub's own
    while e is not None and len(chain) < 8:
        chain.append(type(e).__name__)
        e = e.__cause__ or e.__context__
    print(json.dumps({"error": type(exc).__name__, "status": status, "message": lines[0],
                      "chain": chain}))
    sys.exit(1)
print(json.dumps({"path": path}))
"""
# the hub client's errors (requests', httpx's, the stdlib's, by name) that a retry may get past
HUB_TRANSIENT = frozenset({
    "ConnectionError", "ConnectError", "ConnectTimeout", "ReadTimeout", "WriteTimeout",
    "PoolTimeout", "Timeout", "TimeoutException", "ReadError", "WriteError", "RemoteProtocolError",
    "ChunkedEncodingError", "TimeoutError", "ConnectionRefusedError", "ConnectionResetError",
    "IncompleteRead", "RemoteDisconnected",
})  # fmt: skip
# The hub client's HF_HOME: an empty root-only directory under /run, on which hub_client.py
# bind-mounts root's staging directory in the client's own mount namespace (see there why)
HUB_MOUNT = "/run/servefleet-fetch-{}"
HUB_CLIENT = Path(__file__).resolve().parent / "hub_client.py"
HUB_ENV_DROPPED = (
    "HF_ENDPOINT",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)


def hub_transient(result: dict[str, Any]) -> bool:
    """Whether the hub client's failure is worth another try: an HTTP status of
    ``retry.TRANSIENT_HTTP``, or (without a status) a connection error or timeout among its
    causes.

    + result: the client's JSON line
    """
    status = result.get("status")
    if isinstance(status, int):
        return status in retry.TRANSIENT_HTTP
    chain = result.get("chain")
    return isinstance(chain, list) and any(name in HUB_TRANSIENT for name in chain)


def _hub_problem(a: argparse.Namespace, result: dict[str, Any]) -> str:
    error, status, message = result.get("error"), result.get("status"), result.get("message")
    if status in (401, 403) or error in ("GatedRepoError", "RepositoryNotFoundError"):
        hint = (
            f"check the {a.token_env} environment variable on the controller"
            if a.token_env
            else "a token may be needed (--token-file)"
        )
        return f"the Hugging Face hub refused {a.model} ({message}); {hint}"
    if error == "RevisionNotFoundError":
        return f"the Hugging Face hub has no revision {a.revision} of {a.model}"
    return f"downloading {a.model} from the Hugging Face hub failed: {error}: {message}"


def from_hub(a: argparse.Namespace, hub: Path, uid: int, gid: int) -> str:
    """Download a.model with snapshot_download in the release venv into root's own staging
    directory (its HF_HOME: a descriptor the client inherits, so nothing the serve user plants
    in its hub redirects a write), check it, give it to the owner and move it into hub; return
    its revision."""
    env = {k: v for k, v in os.environ.items() if k not in HUB_ENV_DROPPED}
    env.update(
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_ETAG_TIMEOUT=f"{a.timeout:g}",
        HF_HUB_DOWNLOAD_TIMEOUT=f"{a.timeout:g}",
    )
    if a.token_file:
        env["HF_TOKEN_PATH"] = a.token_file
    if a.endpoint:
        env["HF_ENDPOINT"] = a.endpoint.rstrip("/")
    with staging(hub) as tmp, hub_mount() as mount:
        env["HF_HOME"] = mount  # the staging directory, bind-mounted there (its descriptor)
        client = [a.hub, "-c", HUB_CODE, a.model, a.revision or ""]
        staged_at = str(a.hf_home / "hub" / tmp.name)  # opened again there, from / (no link)
        launcher = ["unshare", "--mount", "--propagation", "private", "--", sys.executable,
                    str(HUB_CLIENT), str(tmp.fd), staged_at, mount, "--", *client]  # fmt: skip

        def once() -> dict[str, Any]:
            try:
                proc = subprocess.run(
                    launcher,
                    env=env,
                    capture_output=True,
                    text=True,
                    pass_fds=(tmp.fd,),
                )
            except OSError as exc:
                raise Refusal(f"cannot run unshare: {exc.strerror}") from None
            lines = proc.stdout.strip().splitlines()
            try:
                result = json.loads(lines[-1]) if lines else {}
            except ValueError:
                result = {}
            if proc.returncode != 0 or not isinstance(result.get("path"), str):
                if result.get("error") and hub_transient(result):
                    status, error = result.get("status"), result.get("error")
                    raise retry.Again(
                        f"it answered {status}" if status else f"{error}: {result.get('message')}"
                    )
                if result.get("error"):
                    raise Refusal(_hub_problem(a, result))
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise Refusal(f"downloading {a.model} from the Hugging Face hub failed: {tail}")
            return dict(result)

        try:
            result = retry.attempts(once, a.tries, a.retry_wait)
        except retry.GaveUp as gave_up:
            where = f"the Hugging Face hub for {a.model}"
            raise could_not_reach(where, str(gave_up.last), gave_up) from None
        top = repo_dir_name(a.model)
        staged = tmp.path / "hub" / top
        snapshot = Path(result["path"])
        wanted = a.revision or snapshot.name
        if (
            snapshot.parent != Path(mount, "hub", top, "snapshots")
            or snapshot.name != wanted
            or not REVISION_RE.fullmatch(wanted)
        ):
            raise Refusal(
                f"snapshot_download gave {snapshot}, not "
                f"{a.hf_home}/hub/{top}/snapshots/{a.revision or '<commit>'}"
            )
        rev = check_snapshot(staged, snapshot.name, "the hub")
        give(staged, uid, gid)
        move_in(hub, staged, top, tmp.path)
    return rev


# --- command line --------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise Refusal(f"fetch_model.py: {message}", code=2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(prog="fetch_model.py", description="Fetch a model into $HF_HOME/hub.")
    ap.add_argument("model", help="ORG/NAME")
    ap.add_argument("hf_home", type=Path, help="absolute path of HF_HOME")
    ap.add_argument("owner", help="the user (and its primary group) to own the files")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--store", metavar="URL", help="a model store (http or https)")
    src.add_argument("--hub", metavar="PYTHON", help="a python with huggingface_hub")
    src.add_argument("--archive", metavar="FILE", help="a local archive (needs --sha256)")
    ap.add_argument("--endpoint", metavar="URL", help="the hub's address (HF_ENDPOINT), with --hub")
    ap.add_argument("--token-file", metavar="FILE", help="the token (a 0600 file)")
    ap.add_argument("--token-env", metavar="NAME", help="the controller's variable of the token")
    ap.add_argument("--revision", metavar="REV", help="pin this commit (40 hex digits)")
    ap.add_argument("--sha256", metavar="HEX", help="the store archive's sha256")
    ap.add_argument("--timeout", metavar="SECONDS", type=float, default=60.0)
    ap.add_argument("--lock-timeout", metavar="SECONDS", type=float, default=600.0)
    ap.add_argument("--tries", metavar="N", type=int, default=retry.TRIES,
                    help="the most tries of a request that fails transiently")  # fmt: skip
    ap.add_argument("--retry-wait", metavar="SECONDS", type=float, default=retry.FIRST_WAIT,
                    help="seconds before the second try, doubled before each next one")  # fmt: skip
    a = ap.parse_args(argv)
    problem = bad_model_id(a.model)
    if a.sha256:
        a.sha256 = a.sha256.lower()
    if problem is None and not a.hf_home.is_absolute():
        problem = f"HF_HOME must be an absolute path, not {a.hf_home}"
    if problem is None and a.revision is not None and not REVISION_RE.fullmatch(a.revision):
        problem = f"--revision {a.revision!r} is not a commit hash (40 lowercase hex digits)"
    if problem is None and a.sha256 is not None and not SHA256_RE.fullmatch(a.sha256):
        problem = f"--sha256 {a.sha256!r} is not 64 hex digits"
    if problem is None and a.archive is not None and a.sha256 is None:
        problem = "--archive needs --sha256"
    if problem is None and not a.timeout > 0:
        problem = f"--timeout must be above 0, not {a.timeout:g}"
    if problem is None and not a.lock_timeout > 0:
        problem = f"--lock-timeout must be above 0, not {a.lock_timeout:g}"
    if problem is None and not 1 <= a.tries <= 20:
        problem = f"--tries must be 1 to 20, not {a.tries}"
    if problem is None and not 0 <= a.retry_wait <= 60:
        problem = f"--retry-wait must be 0 to 60 seconds, not {a.retry_wait:g}"
    if problem is None and a.token_env is not None and not ENV_NAME_RE.fullmatch(a.token_env):
        problem = f"--token-env {a.token_env!r} is not a variable name"
    if problem is None and a.endpoint is not None and a.hub is None:
        problem = "--endpoint goes with --hub"
    for option, url in (("--store", a.store), ("--endpoint", a.endpoint)):
        if problem is None and url is not None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
                problem = f"{option} {url!r} is not an http(s) URL"
            elif parts.username or parts.password:
                problem = f"{option} must not carry credentials; give --token-file"
    if problem:
        raise Refusal(f"fetch_model.py: {problem}", code=2)
    return a


def read_token(path: str) -> str:
    """The token in path, a file only its owner may read."""
    try:
        mode = os.stat(path).st_mode
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise Refusal(f"cannot read the token file {path}: {exc}") from None
    if mode & 0o077:
        raise Refusal(f"the token file {path} is open to others (mode {mode & 0o777:o}); chmod 600")
    if not TOKEN_RE.fullmatch(token):
        raise Refusal(f"the token file {path} does not hold one token")
    return token


def fetch(a: argparse.Namespace) -> str:
    """Fetch a.model as a says; return its revision."""
    try:
        user = pwd.getpwnam(a.owner)
    except KeyError:
        raise Refusal(f"no user {a.owner} on this host") from None
    token = read_token(a.token_file) if a.token_file else None
    # HF_HOME is the serve user's: root reaches its hub through one descriptor, opened from / with
    # no link followed, and works below it by /proc/self/fd paths nothing can redirect (#18)
    try:
        above = trusted.open_path(str(a.hf_home.parent), owner=(0, 0))  # made root's if missing
        try:  # HF_HOME and its hub are the serve user's
            hubfd = trusted.open_below(above, f"{a.hf_home.name}/hub", (user.pw_uid, user.pw_gid))
        finally:
            os.close(above)
    except OSError as exc:
        raise Refusal(f"{a.hf_home}/hub: {exc}") from None
    try:
        return _fetch_into(a, Path(trusted.at(hubfd)), user, token)
    finally:
        os.close(hubfd)


def _fetch_into(a: argparse.Namespace, hub: Path, user: Any, token: str | None) -> str:
    try:
        return _fetch_locked(a, hub, user, token)
    except Refusal as e:  # name the hub as the operator knows it, not by its descriptor
        raise Refusal(str(e).replace(str(hub), str(a.hf_home / "hub")), e.code) from None


def _fetch_locked(a: argparse.Namespace, hub: Path, user: Any, token: str | None) -> str:
    with one_fetch_at_a_time(hub, a.lock_timeout):
        if a.store:
            client = Client(token, a.token_env, a.timeout, a.tries, a.retry_wait)
            rev = from_store(a, hub, client, user.pw_uid, user.pw_gid)
        elif a.archive:
            rev = from_archive(a, hub, user.pw_uid, user.pw_gid)
        else:
            rev = from_hub(a, hub, user.pw_uid, user.pw_gid)
        repo = hub / repo_dir_name(a.model)
        if a.revision:  # servers run offline and load refs/main: make it the pinned snapshot
            point_main(repo, rev, user.pw_uid, user.pw_gid)
        mark_complete(repo, rev, user.pw_uid, user.pw_gid)
    return rev


def main(argv: list[str] | None = None) -> int:
    try:
        a = parse_args(argv)
        rev = fetch(a)
    except Refusal as exc:
        print(f"servefleet: {exc}", file=sys.stderr)
        return exc.code
    except OSError as exc:
        print(f"servefleet: fetching the model failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("servefleet: interrupted", file=sys.stderr)
        return 130
    print(f"{a.model} {rev} is in {a.hf_home / 'hub'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
