"""A release: one venv holding the exact pinned SDK a selection needs, named by what it holds.

Every package comes only from the index that owns it. pip cannot pin a package to one index
(with ``--extra-index-url`` it takes the highest version from any index, so a squatter on the
public index would win), so owned packages are downloaded from their owner alone and then
installed as direct ``name @ file://`` references; pip never looks them up anywhere else.
Everything else comes from the public index, constrained to the pins.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import stat
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.version import Version

from servefleet.base.errors import DataError, ServefleetError
from servefleet.base.remote.layout import RELEASE_MARKER as MARKER, RELEASES
from servefleet.kinds import kind_named, platforms_of
from servefleet.release.glibc import choose, owners
from servefleet.release.lock import Lock, file_differences, load_lock
from servefleet.release.pylock import files_of, packages
from servefleet.release.stack import Stack, stack
from servefleet.release.uvbin import host_uv, uv_version, uv_wheel
from servefleet.release.wheelhouse import HOST_DIR, PACKAGES_DIR, offline_requirements
from servefleet.settings.check_names import canonical_name
from servefleet.settings.check_paths import serve_file
from servefleet.settings.table import Settings
from servefleet.spec import ServeSpec


@dataclass(frozen=True)
class Download:
    """An owned package, fetched from its own index only."""

    name: str
    version: str
    index: str
    auth: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "index": self.index, "auth": self.auth}


@dataclass(frozen=True)
class ShippedFile:
    """A file a command line names (``serve_files``), shipped into the release's ``files/``."""

    argv: str  # the path the command line names
    source: str  # the controller's file
    name: str  # its name in <release>/files: a sha256 prefix and the file's own name
    sha256: str
    data: bytes = field(repr=False)

    def lock_entry(self) -> dict[str, str]:
        """What the lock holds of it (``servefleet.release.lock.write_lock``'s ``files``)."""
        return {"sha256": self.sha256, "name": self.name}


def shipped_files(settings: Settings) -> tuple[ShippedFile, ...]:
    """``serve_files``, read on the controller (each file's bytes and sha256)."""
    out = []
    for argv, source in sorted(settings.serve_files.items()):
        real = serve_file(settings.serve_files_root, argv, source)  # a link may have moved since
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise DataError(f"serve_files: {source!r} is not a regular file")
                data = f.read()
        except OSError as e:
            raise DataError(f"serve_files: {source!r} cannot be read ({e.strerror})") from None
        digest = hashlib.sha256(data).hexdigest()
        name = f"{digest[:16]}-{posixpath.basename(argv) or 'file'}"
        out.append(ShippedFile(argv, source, name, digest, data))
    return tuple(out)


@dataclass(frozen=True)
class ReleasePlan:
    """What the host-side installer (``remote/install_release.py``) does for one release.

    + id: hash of everything that decides the venv's content
    + path: the venv, ``<serve_root>/releases/<id>``
    + downloads: owned packages, each from its own index
    + requirements: what pip installs from the public index (top level; owned ones by path)
    + constraints: the pins of every public package
    + expect: name -> pinned version, checked after install for every installed pin
    + must_have: distributions that must be installed
    + imports: modules that must import in the venv
    """

    id: str
    path: str
    python: str
    downloads: list[Download]
    requirements: list[str]
    constraints: list[str]
    public_index: str | None
    trusted_hosts: list[str]
    expect: dict[str, str]
    must_have: list[str]
    imports: list[str]
    netrc: str | None = field(default=None)
    installer: str = "pip"  # "uv" or "pip" (the venv's content does not depend on it)
    uv: str | None = None  # the uv binary on the host (installer "uv")
    uv_wheel: dict[str, Any] | None = (
        None  # where the host takes it from (None: the deploy sends it)
    )
    stack: Stack | None = None  # what the release is locked as (None only in old callers' tests)
    pylock: str | None = None  # its PEP 751 lock from the lock directory; None: unlocked
    built: tuple[dict[str, str], ...] = ()  # wheels built on the controller for sdist-only packages
    offline: dict[str, str] | None = None  # sdk_source wheelhouse: {"find_links", "requirements"}
    files: tuple[ShippedFile, ...] = ()  # serve_files: shipped into <path>/files (in the id)

    @property
    def locked(self) -> bool:
        return self.pylock is not None

    @property
    def marker(self) -> str:
        return f"{self.path}/{MARKER}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "python": self.python,
            "downloads": [d.to_json() for d in self.downloads],
            "requirements": self.requirements,
            "constraints": self.constraints,
            "public_index": self.public_index,
            "trusted_hosts": self.trusted_hosts,
            "expect": self.expect,
            "must_have": self.must_have,
            "imports": self.imports,
            "netrc": self.netrc,
            "marker": MARKER,
            "installer": self.installer,
            "uv": self.uv,
            "uv_wheel": self.uv_wheel,
            "pylock": self.pylock,
            "locked": [  # the pylock's packages, for the pip installer (no TOML parser there)
                {
                    "name": p["name"],
                    "version": p["version"],
                    "index": p.get("index"),
                    "sha256": sorted(f["sha256"] for f in files_of(p)),
                }
                for p in packages(self.pylock)
            ]
            if self.pylock
            else None,
            "built": list(self.built),
            "offline": self.offline,
        }


def _pin(settings: Settings, name: str) -> str:
    return f"{name}=={settings.sdk_pins[name]}"


def _lock_of(settings: Settings) -> Lock | None:
    return load_lock(settings.sdk_lock) if settings.sdk_lock else None


def uv_source(settings: Settings) -> dict[str, Any] | None:
    """Where the hosts take uv from (install_release.py's plan["uv_wheel"]): the lock's uv wheel
    or, unlocked, the public index's (:func:`servefleet.release.uvbin.uv_wheel`); the host's wheelhouse
    copy of it with ``sdk_source`` wheelhouse. None (the deploy sends the controller's uv): not
    the uv installer, no public index, a lock without uv, or an index that does not answer now.

    + settings: validated data
    """
    if settings.sdk_installer != "uv":
        return None
    lock = _lock_of(settings)
    if lock is not None:
        wheel = lock.uv
    else:
        try:
            wheel = uv_wheel(settings.pip_public_index)
        except ServefleetError:  # not reachable now: the deploy sends the binary instead
            wheel = None
    if wheel and settings.sdk_source == "wheelhouse":
        path = f"{settings.serve_root}/{HOST_DIR}/{PACKAGES_DIR}/{wheel['file']}"
        return {**wheel, "path": path}
    return dict(wheel) if wheel else None


def host_uv_version(settings: Settings) -> str:
    """The uv version the hosts run: the one the lock pins (whatever uv the controller has, #53),
    else the controller's.

    + settings: validated data
    """
    lock = _lock_of(settings) if settings.sdk_installer == "uv" else None
    return lock.uv["version"] if lock is not None and lock.uv else uv_version()


def host_uv_path(settings: Settings) -> str | None:
    """Where the hosts keep the uv releases are installed with (None: the pip installer).

    + settings: validated data
    """
    if settings.sdk_installer != "uv":
        return None
    return host_uv(settings.serve_root, host_uv_version(settings))


def unlocked(settings: Settings) -> Settings:
    """The data as if it had no lock: packages from the indexes (what a lock is made from).

    + settings: validated data
    """
    return replace(settings, sdk_lock=None, sdk_source="index")


def with_locked_models(settings: Settings) -> Settings:
    """The data with the lock's model revisions and archive sha256s where the data pins none.

    + settings: validated data (unchanged without ``sdk_lock``)
    """
    lock = _lock_of(settings)
    if lock is None:
        return settings
    revisions = {m: e["revision"] for m, e in lock.models.items() if e.get("revision")}
    sha256 = {m: e["sha256"] for m, e in lock.models.items() if e.get("sha256")}
    return replace(
        settings,
        models_revisions={**revisions, **settings.models_revisions},
        models_sha256={**sha256, **settings.models_sha256},
    )


def _locked(
    settings: Settings, st: Stack, digest: str
) -> tuple[str, str | None, dict[str, Any] | None]:
    """The release id, pylock and offline install of stack ``st``: the lock's when data names
    one (a stack it lacks is a DataError naming what differs), else ``digest`` and none."""
    pylock = None
    lock = _lock_of(settings)
    if lock is not None:
        locked = lock.for_input(st.digest)
        if locked is None:
            from servefleet.release.lock import differences

            why = "; ".join(differences(lock, [st], {}, {})[:3])
            raise DataError(
                f"sdk_lock: {lock.path} does not lock this host's stack {st.name} ({why}); "
                "run `servefleet lock` and review the diff"
            )
        digest, pylock = locked.release, locked.pylock
    offline = None
    if settings.sdk_source == "wheelhouse":
        if pylock is None:
            raise DataError("sdk_source: 'wheelhouse' needs a lock; set sdk_lock")
        offline = {
            "find_links": f"{settings.serve_root}/{HOST_DIR}/{PACKAGES_DIR}",
            "requirements": offline_requirements(pylock),
        }
    return digest, pylock, offline


ROUTER_PACKAGE = "vllm-router"  # vLLM's router (a Rust binary in a wheel), on the public index


def plan_router_release(settings: Settings) -> ReleasePlan:
    """The router's own release: a venv of ``vllm-router`` at ``serve_router_version`` and what
    it depends on, from the public index (its owner), hash-locked like the stack when data
    names a lock. Its id never equals a stack's (the stack name is part of what is hashed).

    + settings: validated deploy data
    """
    top = [f"{ROUTER_PACKAGE}=={settings.serve_router_version}"]
    content = {
        "python": settings.sdk_python,
        "stack": "router",
        "requirements": top,
        "public_index": settings.pip_public_index,
    }
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
    st = stack(
        name="router",
        requirements=top,
        constraints=[],
        indexes=[],
        public_index=settings.pip_public_index,
        python=settings.sdk_lock_python,
        trusted_hosts=settings.pip_trusted_hosts,
    )
    digest, pylock, offline = _locked(settings, st, digest)
    return ReleasePlan(
        id=digest,
        path=f"{settings.serve_root}/{RELEASES}/{digest}",
        python=settings.sdk_python,
        downloads=[],
        requirements=top,
        constraints=[],
        public_index=settings.pip_public_index,
        trusted_hosts=list(settings.pip_trusted_hosts),
        expect={ROUTER_PACKAGE: settings.serve_router_version},
        must_have=[ROUTER_PACKAGE],
        imports=["vllm_router"],
        installer=settings.sdk_installer,
        uv=host_uv_path(settings),
        uv_wheel=uv_source(settings),
        stack=st,
        pylock=pylock,
        offline=offline,
    )


def plan_release(
    settings: Settings, spec: ServeSpec, netrc: str | None, glibc: str | None = None
) -> ReleasePlan:
    """The release a host needs for ``spec`` under ``settings``.

    With a lock directory (``sdk_lock``) the release is the locked stack (its id the hash of the
    locked set); a stack the lock lacks or whose inputs changed is a DataError naming what
    differs. Without one it is unlocked (its id the hash of the pins and indexes).

    + settings: validated deploy data (pins, indexes, paths)
    + spec: the resolved selection (its requirements pick extras and extra packages)
    + netrc: path of the 0600 netrc on the host holding index credentials, if any index needs them
    + glibc: the host's glibc: a package several indexes own comes from the one whose wheels
      it takes (:func:`servefleet.release.glibc.choose`; None: no host known, the highest glibc's)
    """
    req = spec.requirements
    family = kind_named(spec.kind)
    # the family's platforms install one release: its first's (NVIDIA and AMD: upstream vllm)
    platform = platforms_of(family)[0]
    extras = family.release_extras(spec)  # of the top package (RBLN: vllm-rbln's)
    skipped = {
        pkg
        for extra, pkgs in settings.sdk_extra_packages.items()
        if extra not in extras
        for pkg in pkgs
    }
    chosen = choose(settings.pip_indexes, glibc)
    downloads = [
        Download(name, settings.sdk_pins[name], index.url, index.auth)
        for index in settings.pip_indexes
        for name in index.packages
        if name not in skipped and chosen[name] == index
    ]
    owned = {d.name for d in downloads} | skipped
    first, top_name = platform.top_requirement(settings, extras)
    top = [first] if top_name not in owned else []
    for package in (canonical_name(p) for p in req.packages):
        if package not in settings.sdk_pins:
            raise DataError(
                f"sdk_pins: the selection needs {package}, which has no pin; "
                f"pinned: {', '.join(sorted(settings.sdk_pins))}"
            )
        if package not in owned:
            top.append(_pin(settings, package))
    constraints = [_pin(settings, n) for n in sorted(settings.sdk_pins) if n not in owned]
    must_have = sorted(
        {d.name for d in downloads} | {top_name} | set(map(canonical_name, req.packages))
    )
    for extra in extras:
        must_have = sorted(set(must_have) | set(settings.sdk_extra_packages.get(extra, ())))
    content = {
        "python": settings.sdk_python,
        "downloads": [d.to_json() for d in downloads],
        "requirements": top,
        "constraints": constraints,
        "public_index": settings.pip_public_index,
        "imports": platform.imports(spec),
    }
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
    name = [platform.stack, *extras, *map(canonical_name, req.packages)]
    several = [p for p, found in owners(settings.pip_indexes).items() if len(found) > 1]
    if several:  # one stack for each choice of owners: named by the highest glibc it chose
        need = max((chosen[p].glibc or "0" for p in several), key=Version)
        name.append("glibc" + need.replace(".", "_"))
    st = stack(
        name="-".join(name),
        requirements=[*(f"{d.name}=={d.version}" for d in downloads), *top],
        constraints=constraints,
        indexes=[
            {
                "name": i.name,
                "url": i.url,
                "auth": i.auth,
                "packages": tuple(p for p in i.packages if chosen[p] == i),
            }
            for i in settings.pip_indexes
            if any(chosen[p] == i for p in i.packages)
        ],
        public_index=settings.pip_public_index,
        python=settings.sdk_lock_python,
        trusted_hosts=settings.pip_trusted_hosts,
    )
    digest, pylock, offline = _locked(settings, st, digest)
    files = shipped_files(settings)
    lock = _lock_of(settings)
    if lock is not None:
        wrong = file_differences(lock, {f.argv: f.lock_entry() for f in files})
        if wrong:
            raise DataError(
                f"serve_files: {lock.path} does not lock the files this host ships "
                f"({'; '.join(wrong[:3])}); run `servefleet lock` and review the diff"
            )
    if files:  # their bytes are part of what the release is
        named = {f.name: f.sha256 for f in files}
        digest = hashlib.sha256(json.dumps({"release": digest, "files": named},
                                           sort_keys=True).encode()).hexdigest()[:16]  # fmt: skip
    return ReleasePlan(
        id=digest,
        path=f"{settings.serve_root}/{RELEASES}/{digest}",
        python=settings.sdk_python,
        downloads=downloads,
        requirements=top,
        constraints=constraints,
        public_index=settings.pip_public_index,
        trusted_hosts=list(settings.pip_trusted_hosts),
        expect=dict(sorted(settings.sdk_pins.items())),
        must_have=must_have,
        imports=platform.imports(spec),
        netrc=netrc if any(d.auth for d in downloads) and offline is None else None,
        installer=settings.sdk_installer,
        uv=host_uv_path(settings),
        uv_wheel=uv_source(settings),
        stack=st,
        pylock=pylock,
        offline=offline,
        files=files,
    )
