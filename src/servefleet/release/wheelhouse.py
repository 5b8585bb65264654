"""The offline wheelhouse: every file of a lock, downloaded and checked on the controller, and
what a host that installs from it lacks.

``servefleet wheelhouse DIR`` fills DIR from the lock directory (``sdk_lock``):

- ``packages/<file>``: every wheel and sdist of every stack's pylock;
- ``driver/<file>``: the driver runfile of each locked driver version;
- ``models/<ORG>/<NAME>.tar.gz``: each model's store archive (a model the lock takes from the
  hub has none: it is named and skipped);
- ``manifest.json``: ``{"wheelhouse_version": 1, "files": {relative path: sha256}}``, the files
  checked by this run.

Each file streams into a temporary file next to its place while its sha256 is computed, and is
renamed into place only when that matches the lock; a file already there with the right sha256
is not downloaded again. A download that fails transiently (a connection refused or reset, a
timeout, HTTP 408/425/429/5xx) is tried again (``remote/retry.py``, the host fetcher's rule);
a refusal (401, 403, 404, another sha256) never is. When every failure is one that persisted
after its tries, :func:`fill` raises :class:`~servefleet.base.errors.Unreachable` (exit 3).

Credentials go only to the origins (scheme, host, port) the data names (:func:`credentials`):
the index's to its ``pip_indexes`` with ``auth``, the Hugging Face token to ``models_store_url``
and ``models_hub_url``; never to one a lock names (a lock is a file many people write: a model
URL or a stack's index edited in it gets nothing, and is downloaded anonymously). Neither
follows a redirect to another origin (:func:`servefleet.base.download.opener`).

With ``sdk_source = "wheelhouse"`` a deploy copies to a host only the files its steps need and
it lacks (checked by sha256 on the host), under ``<serve_root>/wheelhouse/`` in the same layout;
the release installs with no index (:func:`offline_requirements`), the models and the driver
runfile come from that copy.

Controller-side; imports no pyinfra.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from servefleet.base.download import credentials_for, opener, same_origin
from servefleet.base.errors import ServefleetError, Unreachable
from servefleet.base.files import sha256_of as file_sha256
from servefleet.base.remote import layout, retry
from servefleet.base.remote.layout import WHEELHOUSE
from servefleet.release.lock import Lock
from servefleet.release.pylock import files_of, packages
from servefleet.release.stack import basic_auth

if TYPE_CHECKING:
    from servefleet.settings.table import Settings

MANIFEST = "manifest.json"
WHEELHOUSE_VERSION = 1
HOST_DIR = WHEELHOUSE  # under serve_root: the host's copy
PACKAGES_DIR = "packages"
CHUNK = 1 << 20
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class WheelhouseError(ServefleetError):
    """A wheelhouse that cannot be made or used (one line)."""


@dataclass(frozen=True)
class File:
    """One file of a lock, as the wheelhouse holds it.

    + path: relative to the wheelhouse (``packages/x.whl``, ``driver/r.run``, ``models/o/n.tar.gz``)
    + url: where the lock says it comes from
    + sha256: what the lock says it is
    + auth: the credentials it may get, ``index`` (a package), ``hf`` (a model archive) or None;
      only when its origin is one the data names for them (:class:`Credentials`)
    """

    path: str
    url: str
    sha256: str
    auth: str | None = None

    def __post_init__(self) -> None:
        if not _SHA256.fullmatch(str(self.sha256)):
            raise WheelhouseError(
                f"{self.path}: the lock's sha256 {self.sha256!r} is not 64 hex digits"
            )


@dataclass(frozen=True)
class Credentials:
    """The controller's secrets (from the variables the data's ``creds_*_env`` name) and the
    data's URLs whose origins each may go to (:func:`credentials`).

    + index_origins: the URLs of the data's ``pip_indexes`` with ``auth``
    + hf_origins: the data's ``models_store_url`` and ``models_hub_url``
    """

    index_user: str | None = None
    index_password: str | None = None
    hf_token: str | None = None
    index_origins: tuple[str, ...] = ()
    hf_origins: tuple[str, ...] = ()


def credentials(s: Settings) -> Credentials:
    """The secrets of validated data, each for the origins that data names for it.

    + s: the settings (its secrets read from the controller's environment)
    """
    return Credentials(
        s.index_user,
        s.index_password,
        s.hf_token,
        tuple(i.url for i in s.pip_indexes if i.auth),
        tuple(url for url in (s.models_store_url, s.models_hub_url) if url),
    )


@dataclass
class Filled:
    """What :func:`fill` did: relative paths downloaded and already present, failure lines
    (``unreachable``: those of them that failed transiently on every try)."""

    downloaded: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    bytes: int = 0
    unreachable: list[str] = field(default_factory=list)


def _name_of(url: str) -> str:
    name = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    if not _FILE_NAME.fullmatch(name) or name.endswith(".part"):
        raise WheelhouseError(f"{url}: not a file name a wheelhouse can hold ({name!r})")
    return name


def package_files(pylock: str) -> list[File]:
    """Every wheel and sdist of a pylock as wheelhouse files (each may get the index
    credentials, on an origin the data names for them).

    + pylock: PEP 751 text
    """
    return [
        File(f"{PACKAGES_DIR}/{_name_of(f['url'])}", f["url"], f["sha256"], "index")
        for p in packages(pylock)
        for f in files_of(p)
    ]


def driver_file(version: str, entry: Mapping[str, Any]) -> File:
    """The runfile of a locked driver version.

    + version: the driver version
    + entry: the lock's ``{"url", "sha256"}`` of it
    """
    if not entry.get("url") or not entry.get("sha256"):
        raise WheelhouseError(f"driver {version}: the lock has no runfile URL and sha256 for it")
    return File(f"driver/{_name_of(entry['url'])}", entry["url"], entry["sha256"])


def uv_file(entry: Mapping[str, Any]) -> File:
    """The uv wheel the hosts take uv from.

    + entry: the lock's ``uv`` (``{"version", "file", "url", "sha256"}``)
    """
    return File(f"{PACKAGES_DIR}/{_name_of(entry['url'])}", entry["url"], entry["sha256"])


def model_file(model: str, entry: Mapping[str, Any]) -> File | None:
    """The store archive of a locked model; None when the lock takes it from the hub.

    + model: ``ORG/NAME``
    + entry: the lock's ``{"revision", "url", "sha256"}`` of it
    """
    if not entry.get("url"):
        return None
    if not layout.MODEL_ID.fullmatch(model) or not entry.get("sha256"):
        raise WheelhouseError(f"model {model}: the lock has no usable archive sha256 or id")
    return File(f"models/{model}.tar.gz", entry["url"], entry["sha256"], "hf")


def _unique(found: Iterable[File]) -> list[File]:
    out: dict[str, File] = {}
    for f in found:
        have = out.setdefault(f.path, f)
        if have.sha256 != f.sha256:
            raise WheelhouseError(
                f"{f.path}: the lock names two files of this name ({have.sha256} from "
                f"{have.url}, {f.sha256} from {f.url})"
            )
    return sorted(out.values(), key=lambda f: f.path)


def lock_files(lock: Lock) -> tuple[list[File], list[str]]:
    """Every file of a lock, and the models it cannot hold (from the hub: no archive).

    + lock: a lock read with :func:`servefleet.release.lock.load_lock`
    """
    found: list[File] = []
    for st in lock.stacks.values():  # its inputs (indexes with auth) decide no credential
        found += package_files(st.pylock)
    found += [driver_file(v, e) for v, e in sorted(lock.driver.items())]
    if lock.uv:  # the wheel the hosts take uv from (uvbin.uv_wheel)
        found.append(uv_file(lock.uv))
    hub = []
    for model, entry in sorted(lock.models.items()):
        f = model_file(model, entry)
        if f is None:
            hub.append(model)
        else:
            found.append(f)
    return _unique(found), hub


# ---------------------------------------------------------------------------------------------
# Downloading (controller)


def sha256_of(path: Path) -> str | None:
    """The sha256 of a file, None when it cannot be read.

    + path: the file
    """
    try:
        return file_sha256(path)
    except OSError:
        return None


def _allowed(f: File, creds: Credentials) -> tuple[str, ...]:
    """The data's URLs whose origins may get f's credentials."""
    return {"index": creds.index_origins, "hf": creds.hf_origins}.get(f.auth or "", ())


def _headers(f: File, creds: Credentials) -> dict[str, str]:
    if f.auth == "index" and creds.index_user and creds.index_password:
        secret = basic_auth(creds.index_user, creds.index_password)
    elif f.auth == "hf" and creds.hf_token:
        secret = {"Authorization": f"Bearer {creds.hf_token}"}
    else:
        return {}
    return credentials_for(f.url, _allowed(f, creds), secret)


def _download(
    f: File, dest: Path, creds: Credentials, timeout: float, tries: int, first_wait: float
) -> tuple[str, int, bool]:
    """Stream f.url into dest (a temporary file next to it, renamed when its sha256 is the
    lock's), tried again after a transient failure; return ``("", bytes, False)`` or a failure
    line, 0 and whether it is "could not reach" (every try failed transiently)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    request = urllib.request.Request(f.url, headers=_headers(f, creds))

    def once() -> tuple[str, int]:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        digest, size = hashlib.sha256(), 0
        try:
            with os.fdopen(fd, "wb") as out, opener().open(request, timeout=timeout) as response:
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                retry.check_whole(response)
            if digest.hexdigest() != f.sha256:
                return (
                    f"{f.path}: {f.url} has sha256 {digest.hexdigest()}, the lock has {f.sha256}",
                    0,
                )
            os.replace(tmp, dest)
            return "", size
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    try:
        failure, size = retry.attempts(once, tries, first_wait)
        return failure, size, False
    except retry.GaveUp as e:
        return f"{f.path}: could not reach {f.url}: {e}", 0, True
    except urllib.error.HTTPError as e:
        hint = ""
        if e.code in (401, 403) and f.auth and same_origin(f.url, _allowed(f, creds)):
            names = (
                "creds_index_user_env/creds_index_password_env"
                if f.auth == "index"
                else "creds_hf_token_env"
            )
            hint = f" (set the variables {names} name)"
        elif e.code in (401, 403) and f.auth:
            keys = (
                "pip_indexes with auth" if f.auth == "index" else "models_store_url/models_hub_url"
            )
            hint = f" (no credentials sent: its origin is none of the data's {keys})"
        return f"{f.path}: {f.url} answered {e.code}{hint}", 0, False
    except (urllib.error.URLError, OSError) as e:
        return f"{f.path}: {f.url}: not readable ({getattr(e, 'reason', e)})", 0, False


def fill(
    directory: str | Path,
    files: Iterable[File],
    creds: Credentials,
    echo: Callable[[str], None] = print,
    timeout: float = 60,
    progress: Callable[[int], AbstractContextManager[Any]] | None = None,
    tries: int = retry.TRIES,
    retry_wait: float = retry.FIRST_WAIT,
) -> Filled:
    """Download every file the directory lacks (or holds with another sha256), each checked
    against the lock and tried again after a transient failure; then write the manifest of the
    files checked. Raises :class:`~servefleet.base.errors.Unreachable` (one line, after the manifest)
    when files failed and every one of them could not be reached; other failures are returned.

    + directory: the wheelhouse
    + files: what it must hold (:func:`lock_files`)
    + creds: the controller's secrets
    + echo: where a line per downloaded file goes
    + timeout: seconds for each connect and read
    + progress: called with the number of files to download (when there are any); gives a
      context manager whose value's ``update(1)`` is called as each one ends (click's
      ``progressbar``)
    + tries: the most tries of each file
    + retry_wait: seconds before a file's second try (doubled before each next one)
    """
    root = Path(directory).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    done = Filled()
    wanted = list(files)
    missing = [f for f in wanted if sha256_of(root / f.path) != f.sha256]
    done.present = [f.path for f in wanted if f not in missing]
    bar = progress(len(missing)) if progress and missing else nullcontext()
    with bar as shown, ThreadPoolExecutor(max_workers=4) as pool:
        running = [pool.submit(_download, f, root / f.path, creds, timeout, tries, retry_wait)
                   for f in missing]  # fmt: skip
        for _ in as_completed(running):
            if shown is not None:
                shown.update(1)
        results = [r.result() for r in running]
    for f, (failure, size, unreachable) in zip(missing, results, strict=True):
        if failure:
            done.failed.append(failure)
            if unreachable:
                done.unreachable.append(failure)
        else:
            done.downloaded.append(f.path)
            done.bytes += size
            echo(f"{f.path}: {size} bytes, sha256 {f.sha256} checked")
    good = set(done.present) | set(done.downloaded)
    manifest = {"wheelhouse_version": WHEELHOUSE_VERSION,
                "files": {f.path: f.sha256 for f in wanted if f.path in good}}  # fmt: skip
    tmp = root / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(root / MANIFEST)
    if done.failed and done.failed == done.unreachable:  # nothing refused: worth a re-run
        more = len(done.failed) - 1
        raise Unreachable(
            f"wheelhouse {directory}: {done.failed[0]}"
            + (f"; and {more} more file(s) could not be reached" if more else "")
            + f" ({len(done.downloaded)} downloaded, {len(done.present)} already there)"
        )
    return done


# ---------------------------------------------------------------------------------------------
# Using it (deploys)


def read_manifest(directory: str | Path) -> dict[str, str]:
    """A wheelhouse's relative path -> sha256.

    + directory: the wheelhouse (sdk_wheelhouse)
    """
    path = Path(directory).expanduser() / MANIFEST
    try:
        doc = json.loads(path.read_text())
        files = doc["files"] if doc.get("wheelhouse_version") == WHEELHOUSE_VERSION else None
    except FileNotFoundError:
        raise WheelhouseError(
            f"sdk_wheelhouse: {directory} has no {MANIFEST}; run `servefleet wheelhouse {directory}`"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise WheelhouseError(f"sdk_wheelhouse: {path}: not readable ({e})") from None
    if not isinstance(files, dict):
        raise WheelhouseError(f"sdk_wheelhouse: {path}: not a wheelhouse manifest")
    return {str(k): str(v) for k, v in files.items()}


@dataclass(frozen=True)
class Copy:
    """One file a host gets from the wheelhouse.

    + kind: the step that needs it: ``release``, ``driver`` or ``models``
    + name: what it is for that step: a file name, the driver version, the model id
    + src: the file on the controller
    + dest: where the host keeps it
    + sha256: what it must be
    + size: its bytes
    """

    kind: str
    name: str
    src: str
    dest: str
    sha256: str
    size: int


def host_path(root: str, path: str) -> str:
    """Where a host keeps a wheelhouse file.

    + root: serve_root
    + path: the file's path in the wheelhouse
    """
    return f"{root}/{HOST_DIR}/{path}"


def host_copies(
    directory: str,
    root: str,
    lock: Lock,
    pylock: str | None,
    driver_version: str | None,
    models: Iterable[str],
) -> list[Copy]:
    """The wheelhouse files a host's steps need: the release's packages (when it installs one),
    the driver runfile (when it installs one), the archives of the models it lacks.

    Raises WheelhouseError naming a file the lock or the wheelhouse lacks.

    + directory: the wheelhouse on the controller (sdk_wheelhouse)
    + root: serve_root on the host
    + lock: the lock
    + pylock: the release's pylock text, or None (installed already)
    + driver_version: the driver to install, or None
    + models: the models to fetch
    """
    wanted = [("release", f.path, f) for f in _unique(package_files(pylock))] if pylock else []
    if pylock and lock.uv:  # the uv wheel the host takes its uv from (uvbin.uv_wheel)
        wanted.append(("release", uv_file(lock.uv).path, uv_file(lock.uv)))
    if driver_version:
        if driver_version not in lock.driver:
            raise WheelhouseError(
                f"sdk_lock: no driver runfile for driver {driver_version}; run `servefleet lock`"
            )
        wanted.append(
            ("driver", driver_version, driver_file(driver_version, lock.driver[driver_version]))
        )
    for model in models:
        f = model_file(model, lock.models.get(model) or {})
        if f is None:
            raise WheelhouseError(
                f"sdk_source: {model} comes from the hub, and a wheelhouse holds only store "
                "archives; set models_store_url and run `servefleet lock` again"
            )
        wanted.append(("models", model, f))
    manifest = read_manifest(directory) if wanted else {}
    out = []
    for kind, name, f in wanted:
        src = Path(directory).expanduser() / f.path
        if manifest.get(f.path) != f.sha256 or not src.is_file():
            raise WheelhouseError(
                f"sdk_wheelhouse: {directory} lacks {f.path} (sha256 {f.sha256}); run "
                f"`servefleet wheelhouse {directory}`"
            )
        size = src.stat().st_size
        out.append(Copy(kind, name, str(src), host_path(root, f.path), f.sha256, size))
    return out


def offline_requirements(pylock: str) -> str:
    """A hashed requirements file of exactly a pylock's packages, for ``uv pip install
    --no-index --find-links DIR --require-hashes --no-deps`` (the pylock's URLs name indexes).

    + pylock: PEP 751 text
    """
    lines = []
    for p in packages(pylock):
        if not p.get("version"):
            raise WheelhouseError(f"{p.get('name')}: a locked package without a version")
        marker = f" ; {p['marker']}" if p.get("marker") else ""
        hashes = sorted({f["sha256"] for f in files_of(p)})
        lines.append(f"{p['name']}=={p['version']}{marker}"
                     + "".join(f" \\\n    --hash=sha256:{h}" for h in hashes))  # fmt: skip
    return "".join(line + "\n" for line in lines)
