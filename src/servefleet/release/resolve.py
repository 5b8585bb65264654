"""A stack resolved with uv on the controller into its PEP 751 lock text, where no code from an
index runs in the process tree that holds the index credentials (#31 finding 2): that uv
cannot start a build (:func:`lock_cache`), and an sdist whose dependencies are dynamic is built
for its metadata in the sandbox with no credential (:func:`sdist_metadata`).

Controller-side; imports no pyinfra.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from servefleet.base.download import credentials_for
from servefleet.base.errors import Unreachable
from servefleet.base.files import sha256_of, write_atomic
from servefleet.base.subenv import child_env
from servefleet.release import sdists, simpleindex
from servefleet.release.stack import LockError, Stack, basic_auth, credentials_env, project_toml
from servefleet.release.uvbin import last_error


def _uv() -> str:
    from servefleet.release.uvbin import uv_binary

    return str(uv_binary())


NO_BUILD = "builds-v0"  # where uv makes a build's environment in its cache: a file, so it cannot


def lock_cache() -> Path:
    """The uv cache of the resolves that hold credentials, where no build can start: its
    ``builds-v0`` is a regular file, so uv fails ("failed to create directory") before it runs
    any sdist's build backend, naming the package (uv's ``--no-build`` cannot serve: it refuses
    sdist-only packages even with their metadata given)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = base / "servefleet" / "uv-lock"
    cache.mkdir(parents=True, exist_ok=True)
    guard = cache / NO_BUILD
    if guard.is_dir() and not guard.is_symlink():
        shutil.rmtree(guard)
    elif guard.is_symlink():
        guard.unlink()
    try:
        fd = os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
        os.write(fd, b"servefleet: no sdist is built in a process that holds credentials\n")
        os.close(fd)
    except FileExistsError:
        pass
    if not stat.S_ISREG(os.lstat(guard).st_mode):
        raise LockError(f"{guard}: not a regular file; remove it")
    return cache


# uv's words for a network that failed it (after its own retries), not an index that refused
_UV_NETWORK = re.compile(
    r"error sending request|Could not connect|Connection refused|connection reset|"
    r"operation timed out|dns error|failed to lookup address|Network is unreachable|"
    r"\b50[234] (?:Bad Gateway|Service Unavailable|Gateway Timeout)"
)
_NEEDS_BUILD = re.compile(r"(?:Failed to (?:download and )?build|build) `([^`=@ ]+)==([^`@ ]+)`")


def resolve(st: Stack, user: str | None = None, password: str | None = None) -> str:
    """The stack's PEP 751 lock text (``uv lock`` then ``uv export --format pylock.toml``).

    Credentials reach uv in its environment only, and that uv builds nothing (its cache has no
    room for a build: :func:`lock_cache`). An sdist whose dependencies are dynamic is built for
    its metadata in the sandbox, with no credential (:func:`sdist_metadata`), and uv is given
    that metadata (``[[tool.uv.dependency-metadata]]``) and asked again. Raises LockError with
    uv's reason.

    + st: the stack
    + user, password: credentials for indexes with ``auth``
    """
    env = child_env(
        {
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_PROGRESS": "1",
            "UV_CACHE_DIR": str(lock_cache()),
            **credentials_env(st, user, password),
        }
    )
    env.pop("UV_NO_CACHE", None)
    known: dict[tuple[str, str], dict[str, Any]] = {}
    while True:
        try:
            return _resolve_once(st, env, list(known.values()))
        except _NeedsBuild as need:
            if need.package in known:
                raise LockError(
                    f"stack {st.name}: uv still wants to build {'=='.join(need.package)} "
                    "with its metadata given"
                ) from None
            known[need.package] = sdist_metadata(st, *need.package, user, password)


class _NeedsBuild(Exception):
    def __init__(self, package: tuple[str, str]) -> None:
        self.package = package


def _resolve_once(st: Stack, env: Mapping[str, str], metadata: list[dict[str, Any]]) -> str:
    with tempfile.TemporaryDirectory(prefix="servefleet-lock-") as tmp:
        Path(tmp, "pyproject.toml").write_text(project_toml(st, metadata))
        for cmd in (
            [_uv(), "lock", "--quiet", "--directory", tmp],
            [_uv(), "export", "--quiet", "--directory", tmp, "--frozen", "--format",
             "pylock.toml", "--no-emit-project", "--no-header", "-o", "pylock.toml"],
        ):  # fmt: skip
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode == 0:
                continue
            if NO_BUILD in proc.stderr:
                found = _NEEDS_BUILD.search(proc.stderr)
                if found:
                    raise _NeedsBuild((canonicalize_name(found[1]), found[2]))
                raise LockError(
                    f"stack {st.name}: uv wanted to build an sdist it did not name: "
                    f"{last_error(proc.stderr)}"
                )
            if _UV_NETWORK.search(proc.stderr):
                raise Unreachable(
                    f"stack {st.name}: uv {cmd[1]} could not reach an index "
                    f"({last_error(proc.stderr)}); transient: try again later"
                )
            raise LockError(f"stack {st.name}: uv {cmd[1]} failed: {last_error(proc.stderr)}")
        text = Path(tmp, "pylock.toml").read_text()
    return "".join(line for line in text.splitlines(True) if not line.startswith("#"))


def sdist_file(
    st: Stack, name: str, version: str, user: str | None, password: str | None
) -> tuple[str, str]:
    """The URL and sha256 of ``name==version``'s sdist on the index that owns it (the public
    index for a package nobody owns), read from its PEP 503 page with the owner's credentials
    when it has ``auth`` (and only on its origin).

    + st: the stack
    + name, version: the package (normalized name)
    + user, password: credentials for indexes with ``auth``
    """
    owner = st.owners().get(name)
    index = next((i for i in st.inputs["indexes"] if i["name"] == owner), None)
    base = index["url"] if index else st.inputs["public_index"]
    if not base:
        raise LockError(
            f"{name}=={version} has dynamic metadata and only an sdist; servefleet reads it from "
            "the public index, and none is set (sdk_public_index)"
        )
    headers = basic_auth(user, password) if index and index["auth"] and user and password else {}
    try:
        found = simpleindex.project_files(base, name, headers)
    except simpleindex.PageError as e:
        raise LockError(str(e)) from None
    page = f"{base.rstrip('/')}/{name}/"
    for filename, (url, digest) in found.items():
        stem = next((filename[: -len(x)] for x in (".tar.gz", ".zip") if filename.endswith(x)), "")
        if (
            "-" in stem
            and canonicalize_name(stem.rsplit("-", 1)[0]) == name
            and stem.rsplit("-", 1)[1] == version
        ):
            if digest is None:
                raise LockError(f"{url}: the index gives no sha256 for it")
            return url, digest
    raise LockError(f"{page}: no sdist of {name}=={version}")


def sdist_metadata(
    st: Stack, name: str, version: str, user: str | None, password: str | None
) -> dict[str, Any]:
    """The metadata of an sdist whose dependencies are dynamic: its wheel built in the sandbox,
    with no credential (``servefleet.release.sdists``), once for each sdist sha256 (kept in the
    controller's cache).

    + st: the stack
    + name, version: the package uv wanted to build
    + user, password: credentials to download it from an index with ``auth``
    """
    url, digest = sdist_file(st, name, version, user, password)
    kept = lock_cache().parent / "sdist-metadata" / f"{digest}.json"
    try:
        return dict(json.loads(kept.read_text()))
    except (OSError, ValueError):
        pass
    python = "{}.{}".format(*sys.version_info[:2])
    with tempfile.TemporaryDirectory(prefix="servefleet-metadata-") as tmp:
        src = Path(tmp) / url.rsplit("/", 1)[-1]
        auth = [i["url"] for i in st.inputs["indexes"] if i["auth"]]
        headers = (
            credentials_for(url, auth, basic_auth(user, password)) if user and password else {}
        )
        sdists.fetch(url, src, headers)
        got = sha256_of(src)
        if got != digest:
            raise LockError(f"{url}: the index lists sha256:{digest} and served sha256:{got}")
        meta = sdists.metadata(sdists.build_wheel(st.inputs, src, python, Path(tmp)))
    if canonicalize_name(meta["name"]) != name or meta["version"] != version:
        raise LockError(
            f"{url}: its build made {meta['name']}=={meta['version']}, not {name}=={version}"
        )
    meta["name"] = name
    kept.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(kept, json.dumps(meta, sort_keys=True) + "\n")
    return meta
