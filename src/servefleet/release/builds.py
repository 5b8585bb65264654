"""Wheels built once, on the controller, for the packages a stack has only as an sdist.

arctic-inference 0.1.1 is an sdist whose build imports torch and compiles a C++20 extension
(rbln.md §4). Hosts never build anything (they install with ``--no-build``) and need no
compiler: the controller builds each such sdist once per Python version, from the file the lock
(or, unlocked, the index) names and only after its sha256 matched, into ``sdk_wheel_cache``;
the deploy ships the wheel and the host installs it in place of the sdist.

Controller-side; imports no pyinfra.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servefleet.base.download import credentials_for
from servefleet.base.files import sha256_of
from servefleet.release.pylock import packages
from servefleet.release.sdists import SdistError, build_wheel, fetch
from servefleet.release.stack import Stack, basic_auth

BUILT = "built.json"


BuildError = SdistError  # an sdist that cannot be built on the controller (one line)


@dataclass(frozen=True)
class Built:
    """A wheel built from a locked sdist.

    + name, version: the package
    + sdist_sha256: the sdist it was built from
    + path: the wheel on the controller
    + sha256: the wheel's sha256
    + fresh: built by this call (False: from the cache)
    """

    name: str
    version: str
    sdist_sha256: str
    path: Path
    sha256: str
    fresh: bool = False

    def to_json(self, host_dir: str) -> dict[str, str]:
        return {
            "name": self.name,
            "version": self.version,
            "sdist_sha256": self.sdist_sha256,
            "path": f"{host_dir}/{self.path.name}",
            "sha256": self.sha256,
        }


def cache_dir(cache: str | Path, sdist_sha256: str, python: str) -> Path:
    """Where the wheel of one sdist for one Python version is kept on the controller.

    + cache: ``sdk_wheel_cache``
    + sdist_sha256: the sdist's sha256
    + python: major.minor
    """
    return Path(cache).expanduser() / sdist_sha256 / f"py{python}"


def sdist_only(pylock: str) -> list[dict[str, Any]]:
    """The packages of a lock that have an sdist and no wheel.

    + pylock: PEP 751 text
    """
    return [p for p in packages(pylock) if "sdist" in p and not p.get("wheels")]


def _auth_headers(st: Stack, url: str, user: str | None, password: str | None) -> dict[str, str]:
    """The auth indexes' credentials when ``url`` is on one of their origins (never chosen by
    the index a lock entry names: a lock whose URL alone was edited gets none)."""
    if not (user and password):
        return {}
    auth = [i["url"] for i in st.inputs["indexes"] if i["auth"]]
    return credentials_for(url, auth, basic_auth(user, password))


def build(
    package: Mapping[str, Any],
    python: str,
    st: Stack,
    cache: Path,
    user: str | None = None,
    password: str | None = None,
) -> Built:
    """The wheel of a locked sdist for Python ``python``: from the cache, or built now (once:
    concurrent builds of the same sdist wait for each other).

    + package: the pylock entry (its ``sdist`` url and sha256)
    + python: the hosts' Python major.minor
    + st: the stack (its indexes give the build its dependencies, e.g. torch)
    + cache: the controller's wheel cache (``sdk_wheel_cache``)
    + user, password: credentials for indexes with ``auth``
    """
    name, version = package["name"], package["version"]
    sdist = package["sdist"]
    want = sdist["hashes"]["sha256"]
    out = cache_dir(cache, want, python)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        _lock(lock)
        done = _cached(out, name, version, want)
        if done:
            return done
        with tempfile.TemporaryDirectory(prefix="servefleet-build-") as tmp:
            src = Path(tmp) / sdist["url"].rsplit("/", 1)[-1]
            fetch(sdist["url"], src, _auth_headers(st, sdist["url"], user, password))
            got = sha256_of(src)
            if got != want:
                raise BuildError(
                    f"{name}=={version}: the lock has sha256:{want}, the index served "
                    f"sha256:{got}; nothing built"
                )
            wheel = build_wheel(st.inputs, src, python, Path(tmp))
            shutil.copyfile(wheel, out / wheel.name)
            record = {"wheel": wheel.name, "sha256": sha256_of(out / wheel.name)}
            (out / BUILT).write_text(json.dumps(record, sort_keys=True) + "\n")
        return Built(name, version, want, out / record["wheel"], record["sha256"], fresh=True)


def _lock(file: Any) -> None:
    """Hold ``file``'s lock: against other processes, and against other hosts of the same pyinfra
    run (greenlets of one process, which a blocking flock would deadlock: poll instead)."""
    while True:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.1)


def _cached(out: Path, name: str, version: str, sdist_sha256: str) -> Built | None:
    try:
        record = json.loads((out / BUILT).read_text())
        wheel = out / Path(record["wheel"]).name
        if wheel.is_file() and sha256_of(wheel) == record["sha256"]:
            return Built(name, version, sdist_sha256, wheel, record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None
