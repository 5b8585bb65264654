"""Hash-locked stacks: what ``servefleet lock`` writes, what ``--check`` compares, what deploys read.

A *stack* is the set of packages one selection installs (the SDK pins, the extras and extra
packages it needs, the indexes that own them). ``servefleet lock`` resolves each stack of the
data once, on the controller, with uv, and writes under the lock directory (``sdk_lock``):

- ``pylock.<stack>.toml``: the stack as PEP 751 lock (every package with its exact version, the
  index it comes from, the URL and sha256 of each of its files), as ``uv export`` writes it;
- ``servefleet.lock.json``: per stack the inputs it was made from (to name what differs when
  the data moves on), the pylock file and the release id (the sha256 of the locked set, so a
  release is the same bytes on every host); the driver runfile's sha256; each model's revision
  and store archive sha256; each file ``serve_files`` ships (the path argv names -> its sha256
  and shipped name; absent in a lock of data that ships none).

Every owned package comes only from its owner: the owners' indexes are uv *explicit* indexes,
each owned package pinned to its own, and every other package comes from the public index. A
package that is not owned but that an owner's index serves too is refused: the data must say
whose it is.

This module is controller-side and imports no pyinfra.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from servefleet.base.download import credentials_for, opener, unreachable
from servefleet.base.errors import ServefleetError, Unreachable
from servefleet.base.subenv import child_env
from servefleet.base.version import VERSION
from servefleet.release import sdists, simpleindex
from servefleet.release.uvbin import last_error
from servefleet.remote import retry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LOCK_FILE = "servefleet.lock.json"
LOCK_VERSION = 1
ENVIRONMENT = "sys_platform == 'linux' and platform_machine == 'x86_64'"  # the hosts a lock is for


class LockError(ServefleetError):
    """A lock that cannot be made, read or used (one line)."""


@dataclass(frozen=True, eq=True)
class Stack:
    """What one lock entry is made from (JSON-able ``inputs``; ``name`` is for people).

    + name: ``rbln``, ``rbln-kv-connectors-arctic-inference``, ``gpu``: platform, extras, extras
    + inputs: requirements, constraints, owner indexes, public index, python, trusted hosts
    """

    name: str
    inputs: dict[str, Any]

    def __hash__(self) -> int:
        return hash((self.name, self.digest))

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.inputs, sort_keys=True).encode()).hexdigest()

    def owners(self) -> dict[str, str]:
        """Owned package -> owner index name."""
        return {p: i["name"] for i in self.inputs["indexes"] for p in i["packages"]}


def stack(
    name: str,
    requirements: Iterable[str],
    constraints: Iterable[str],
    indexes: Iterable[Mapping[str, Any]],
    public_index: str | None,
    python: str,
    trusted_hosts: Iterable[str],
) -> Stack:
    """A Stack from a release's parts (see :func:`servefleet.release.plan.stack_for`).

    + name: the stack's readable name
    + requirements: what is installed (owned pins, the top package, extra packages)
    + constraints: pins of public packages
    + indexes: ``{"name", "url", "packages", "auth"}`` of each owner index this stack uses
    + public_index: every other package's index (None: uv's default)
    + python: the Python versions the lock resolves for (a specifier, ``>=3.10``)
    + trusted_hosts: hosts reached over plain http
    """
    return Stack(
        name,
        {
            "requirements": sorted(requirements),
            "constraints": sorted(constraints),
            "indexes": sorted(
                (
                    {
                        "name": i["name"],
                        "url": i["url"].rstrip("/"),
                        "packages": sorted(i["packages"]),
                        "auth": bool(i["auth"]),
                    }
                    for i in indexes
                ),
                key=lambda i: i["name"],
            ),
            "public_index": public_index.rstrip("/") if public_index else None,
            "python": python,
            "trusted_hosts": sorted(trusted_hosts),
        },
    )


# ---------------------------------------------------------------------------------------------
# Resolving (controller, uv)


def _toml(value: Any) -> str:
    """A TOML value for strings, bools, lists and inline tables (JSON strings are TOML strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def project_toml(st: Stack, metadata: Iterable[Mapping[str, Any]] = ()) -> str:
    """The throw-away uv project a stack is resolved as.

    + st: the stack
    + metadata: ``[[tool.uv.dependency-metadata]]`` entries (of sdists built for it)
    """
    inp = st.inputs
    lines = [
        "[project]",
        'name = "servefleet-stack"',
        'version = "0"',
        f"requires-python = {_toml(inp['python'])}",
        f"dependencies = {_toml(inp['requirements'])}",
        "",
        "[tool.uv]",
        "package = false",
        f"constraint-dependencies = {_toml(inp['constraints'])}",
        f"environments = {_toml([ENVIRONMENT])}",
        f"allow-insecure-host = {_toml(inp['trusted_hosts'])}",
    ]
    for index in inp["indexes"]:
        lines += ["", "[[tool.uv.index]]", f"name = {_toml(index['name'])}"]
        lines += [f"url = {_toml(index['url'])}", "explicit = true"]
    if inp["public_index"]:
        lines += ["", "[[tool.uv.index]]", 'name = "public"', f"url = {_toml(inp['public_index'])}"]
        lines += ["default = true"]
    for meta in metadata:
        lines += ["", "[[tool.uv.dependency-metadata]]"]
        lines += [f"{k} = {_toml(v)}" for k, v in sorted(meta.items())]
    lines += ["", "[tool.uv.sources]"]
    lines += [f"{pkg} = {_toml({'index': owner})}" for pkg, owner in sorted(st.owners().items())]
    return "\n".join(lines) + "\n"


def _uv() -> str:
    from servefleet.release.uvbin import uv_binary

    return str(uv_binary())


def index_env(name: str) -> str:
    """uv's variable prefix for an index's credentials (``UV_INDEX_<NAME>_``).

    + name: the index name
    """
    return "UV_INDEX_" + "".join(c if c.isalnum() else "_" for c in name).upper() + "_"


def credentials_env(st: Stack, user: str | None, password: str | None) -> dict[str, str]:
    """uv's environment variables holding the credentials of the stack's indexes with ``auth``
    (credentials reach uv only this way, never in argv).

    + st: the stack
    + user, password: the index credentials (LockError when an index needs them and they lack)
    """
    env: dict[str, str] = {}
    for index in st.inputs["indexes"]:
        if index["auth"]:
            if not (user and password):
                raise LockError(f"the {index['name']} index needs credentials; none are set")
            env[index_env(index["name"]) + "USERNAME"] = user
            env[index_env(index["name"]) + "PASSWORD"] = password
    return env


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
        got = hashlib.sha256(src.read_bytes()).hexdigest()
        if got != digest:
            raise LockError(f"{url}: the index lists sha256:{digest} and served sha256:{got}")
        meta = sdists.metadata(sdists.build_wheel(st.inputs, src, python, Path(tmp)))
    if canonicalize_name(meta["name"]) != name or meta["version"] != version:
        raise LockError(
            f"{url}: its build made {meta['name']}=={meta['version']}, not {name}=={version}"
        )
    meta["name"] = name
    kept.parent.mkdir(parents=True, exist_ok=True)
    _atomic(kept, json.dumps(meta, sort_keys=True) + "\n")
    return meta


def packages(pylock: str) -> list[dict[str, Any]]:
    """The ``[[packages]]`` of a pylock text.

    + pylock: PEP 751 text
    """
    try:
        return list(tomllib.loads(pylock).get("packages", []))
    except tomllib.TOMLDecodeError as e:
        raise LockError(f"not a valid pylock file: {e}") from None


def files_of(package: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every file (wheels and sdist) of a pylock package: ``{"url", "sha256"}``.

    + package: one ``[[packages]]`` entry
    """
    found = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
    return [{"url": f["url"], "sha256": f["hashes"]["sha256"]} for f in found]


def release_id(pylock: str) -> str:
    """The release id of a locked stack: the hash of its locked set (names, versions, indexes,
    file URLs and hashes), independent of the lock file's layout. A URL edited after locking
    changes it, so the lock is refused rather than credentials sent to a new origin (#18
    finding 7).

    + pylock: PEP 751 text
    """
    locked = sorted(
        (p["name"], p["version"], p.get("index", ""),
         sorted((f["url"], f["sha256"]) for f in files_of(p)))
        for p in packages(pylock)
    )  # fmt: skip
    return hashlib.sha256(json.dumps(locked).encode()).hexdigest()[:16]


def basic_auth(user: str, password: str) -> dict[str, str]:
    """The HTTP Basic ``Authorization`` header for an index's credentials.

    + user, password: the credentials
    """
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _get(url: str, auth: tuple[str, str] | None) -> int:
    request = urllib.request.Request(url, headers={"Accept": "text/html", **(
        basic_auth(*auth) if auth else {})})  # fmt: skip

    def once() -> int:
        with opener().open(request, timeout=30) as response:
            return int(response.status)

    try:
        return retry.attempts(once)
    except retry.GaveUp as e:
        raise unreachable(url.rsplit("/", 2)[0], e.last) from None
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError) as e:
        raise LockError(f"{url.rsplit('/', 2)[0]}: not reachable ({e})") from None


def check_owners(
    st: Stack, pylock: str, user: str | None = None, password: str | None = None
) -> None:
    """Refuse a locked public package that an owner's index serves too (the data must say whose
    it is); and an owned package that did not come from its owner.

    + st: the stack
    + pylock: its lock
    + user, password: credentials for indexes with ``auth``
    """
    urls = {i["name"]: i["url"] for i in st.inputs["indexes"]}
    owners = st.owners()
    locked = packages(pylock)
    for p in locked:
        owner = owners.get(p["name"])
        if owner and p.get("index", "").rstrip("/") != urls[owner]:
            raise LockError(
                f"{p['name']} resolved from {p.get('index')}, not from its owner {urls[owner]}"
            )
    public = sorted(p["name"] for p in locked if p["name"] not in owners)
    asks = [
        (name, i["name"], f"{i['url']}/{name}/", (user, password) if i["auth"] else None)
        for name in public
        for i in st.inputs["indexes"]
    ]
    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(lambda a: _get(a[2], a[3]), asks))  # type: ignore[arg-type]
    for (name, index, _url, _auth), code in zip(asks, codes, strict=True):
        if code == 200:
            raise LockError(
                f"{name} is served by the {index} index and by the public index; name its owner "
                f"in pip_indexes.<index>.packages"
            )


def changed_on_index(installed: Mapping[str, Any], pylock: str) -> dict[str, dict[str, Any]]:
    """Packages whose version the indexes still serve, but not with any file the release was
    installed with (a re-upload under the same name and version).

    + installed: package -> [version, sha256s] the release was installed with
    + pylock: what the indexes resolve to now
    """
    out = {}
    for p in packages(pylock):
        have = installed.get(p["name"])
        served = sorted(f["sha256"] for f in files_of(p))
        if have and have[0] == p["version"] and not set(have[1]) & set(served):
            out[p["name"]] = {"version": p["version"], "installed": sorted(have[1]),
                              "served": served}  # fmt: skip
    return out


# ---------------------------------------------------------------------------------------------
# The lock directory


@dataclass(frozen=True)
class Locked:
    """One stack of a lock: its inputs, pylock file and text, and release id."""

    name: str
    input: str
    inputs: dict[str, Any]
    pylock_file: str
    pylock: str
    release: str


@dataclass(frozen=True)
class Lock:
    """A lock directory, read and verified (see the module docstring)."""

    path: Path
    stacks: dict[str, Locked]
    driver: dict[str, Any]
    models: dict[str, Any]
    files: dict[str, Any] = field(default_factory=dict)  # serve_files: argv path -> sha256, name
    uv: dict[str, Any] | None = None  # the uv wheel hosts take uv from (uvbin.uv_wheel)

    def for_input(self, digest: str) -> Locked | None:
        return next((s for s in self.stacks.values() if s.input == digest), None)


def pylock_name(stack_name: str) -> str:
    return f"pylock.{stack_name}.toml"


def write_lock(
    path: Path,
    locked: Mapping[Stack, str],
    driver: Mapping[str, Any],
    models: Mapping[str, Any],
    files: Mapping[str, Any] | None = None,
    uv: Mapping[str, Any] | None = None,
) -> None:
    """Write a lock directory: one pylock per stack, then servefleet.lock.json (stale pylocks of
    stacks no longer locked are removed).

    + path: the lock directory
    + locked: stack -> its pylock text
    + driver: driver version -> {"url", "sha256"}
    + models: model id -> {"revision", "url", "sha256"}
    + files: serve_files' path in argv -> {"sha256", "name"} (none: the entry is left out, as in
      a lock written before it existed)
    + uv: the uv wheel hosts take uv from (none: the deploy sends the controller's)
    """
    path.mkdir(parents=True, exist_ok=True)
    entries = {}
    for st, text in sorted(locked.items(), key=lambda kv: kv[0].name):
        name = pylock_name(st.name)
        _atomic(path / name, text)
        entries[st.name] = {
            "input": st.digest,
            "inputs": st.inputs,
            "pylock": name,
            "release": release_id(text),
        }
    doc = {"lock_version": LOCK_VERSION, "stacks": entries, "driver": dict(driver),
           "models": dict(models), "servefleet": VERSION}  # fmt: skip
    if files:
        doc["files"] = dict(files)
    if uv:
        doc["uv"] = dict(uv)
    _atomic(path / LOCK_FILE, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    keep = {e["pylock"] for e in entries.values()}
    for old in path.glob("pylock.*.toml"):
        if old.name not in keep:
            old.unlink()


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def load_lock(path: str | Path) -> Lock:
    """Read and verify a lock directory (cached while its files are unchanged).

    Raises LockError when it is missing, malformed, or a pylock was edited after locking.

    + path: the lock directory
    """
    p = Path(path).expanduser()
    stamp = tuple(
        (f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in sorted(p.glob("*")) if f.is_file()
    ) if p.is_dir() else ()  # fmt: skip
    return _load(str(p.resolve()), stamp)


@functools.lru_cache(maxsize=8)
def _load(path: str, stamp: tuple[Any, ...]) -> Lock:
    where = Path(path)
    try:
        doc = json.loads((where / LOCK_FILE).read_text())
    except FileNotFoundError:
        raise LockError(f"{where}: no {LOCK_FILE}; run `servefleet lock`") from None
    except (OSError, ValueError) as e:
        raise LockError(f"{where / LOCK_FILE}: not readable: {e}") from None
    if not isinstance(doc, dict) or doc.get("lock_version") != LOCK_VERSION:
        raise LockError(f"{where / LOCK_FILE}: not a servefleet lock (lock_version {LOCK_VERSION})")
    stacks = {}
    for name, entry in (doc.get("stacks") or {}).items():
        try:
            file = entry["pylock"]
            if Path(file).name != file or not file.startswith("pylock."):
                raise LockError(f"{where / LOCK_FILE}: stack {name}: bad pylock name {file!r}")
            text = (where / file).read_text()
            if release_id(text) != entry["release"]:
                raise LockError(
                    f"{where / file}: its packages or their URLs differ from what was locked (release "
                    f"{entry['release']}); run `servefleet lock` again"
                )
            stacks[name] = Locked(name, entry["input"], entry["inputs"], file, text,
                                  entry["release"])  # fmt: skip
        except (KeyError, TypeError, OSError) as e:
            raise LockError(f"{where / LOCK_FILE}: stack {name}: malformed ({e})") from None
    files = doc.get("files") or {}
    if not isinstance(files, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("sha256"), str) for e in files.values()
    ):
        raise LockError(f"{where / LOCK_FILE}: files: malformed (path -> {{sha256, name}})")
    uv = doc.get("uv")
    if uv is not None and not (
        isinstance(uv, dict)
        and all(isinstance(uv.get(k), str) for k in ("version", "file", "url", "sha256"))
        and re.fullmatch(r"uv-[A-Za-z0-9_.+-]+\.whl", uv["file"])
        and re.fullmatch(r"[0-9a-f]{64}", uv["sha256"])
    ):
        raise LockError(f"{where / LOCK_FILE}: uv: malformed (version, file, url, sha256)")
    return Lock(where, stacks, dict(doc.get("driver") or {}), dict(doc.get("models") or {}),
                dict(files), uv)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# --check


def _diff(key: str, old: Any, new: Any) -> list[str]:
    if old == new:
        return []
    if isinstance(old, list) and isinstance(new, list):
        gone = [json.dumps(x, sort_keys=True) if isinstance(x, dict) else str(x)
                for x in old if x not in new]  # fmt: skip
        added = [json.dumps(x, sort_keys=True) if isinstance(x, dict) else str(x)
                 for x in new if x not in old]  # fmt: skip
        return [f"{key}: " + ", ".join([*(f"-{x}" for x in gone), *(f"+{x}" for x in added)])]
    return [f"{key}: {old!r} -> {new!r}"]


def differences(
    lock: Lock,
    wanted: Iterable[Stack],
    driver: Mapping[str, Any],
    models: Mapping[str, Any],
    files: Mapping[str, Any] | None = None,
) -> list[str]:
    """What no longer matches between a lock and the data (empty: the lock is current).

    + lock: the lock read from disk
    + wanted: the stacks the data's hosts need
    + driver: driver version -> {"url", "sha256"} from the data
    + models: model id -> {"revision", "sha256"} the data pins (None: not pinned by data)
    + files: serve_files' path in argv -> {"sha256", "name"} the data ships (None: not compared)
    """
    out: list[str] = []
    seen = set()
    for st in sorted(set(wanted), key=lambda s: s.name):
        seen.add(st.name)
        have = lock.stacks.get(st.name)
        if have is None:
            out.append(f"stack {st.name}: not locked")
            continue
        if have.input != st.digest:
            for key in sorted(set(have.inputs) | set(st.inputs)):
                out += [f"stack {st.name}: {line}"
                        for line in _diff(key, have.inputs.get(key), st.inputs.get(key))]  # fmt: skip
    out += [f"stack {name}: locked but no host uses it" for name in sorted(set(lock.stacks) - seen)]
    for version, entry in sorted(driver.items()):
        if lock.driver.get(version) != entry:
            out.append(f"driver {version}: {lock.driver.get(version)} -> {entry}")
    for model, entry in sorted(models.items()):
        have = lock.models.get(model)
        if have is None:
            out.append(f"model {model}: not locked")
            continue
        for key in ("revision", "sha256"):
            if entry.get(key) and entry[key] != have.get(key):
                out.append(f"model {model}: {key} {have.get(key)} -> {entry[key]}")
    if files is not None:
        out += file_differences(lock, files)
        out += [
            f"file {p}: locked but no host ships it" for p in sorted(set(lock.files) - set(files))
        ]
    return out


def file_differences(lock: Lock, files: Mapping[str, Any]) -> list[str]:
    """The files the data ships that the lock does not hold as they are (by sha256).

    + lock: the lock read from disk
    + files: serve_files' path in argv -> {"sha256", ...} of the files the data ships
    """
    out = []
    for argv, entry in sorted(files.items()):
        have = lock.files.get(argv)
        if have is None:
            out.append(f"file {argv}: not locked")
        elif have.get("sha256") != entry["sha256"]:
            out.append(f"file {argv}: sha256 {have.get('sha256')} -> {entry['sha256']}")
    return out
