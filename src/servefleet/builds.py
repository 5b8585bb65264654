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
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servefleet.download import credentials_for, opener
from servefleet.errors import ServefleetError
from servefleet.lock import Stack, basic_auth, last_error, packages
from servefleet.prewarm_store import sha256_of
from servefleet.subenv import child_env

BUILT = "built.json"


class BuildError(ServefleetError):
    """An sdist that cannot be built on the controller (one line)."""


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


def _version_of(python: str) -> str | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def find_python(version: str) -> str:
    """A controller interpreter of Python ``version`` (``3.11``) with its headers.

    + version: major.minor of the hosts' sdk_python
    """
    if not re.fullmatch(r"3\.\d+", version):
        raise BuildError(f"cannot build for Python {version!r}")
    candidates = [sys.executable, shutil.which(f"python{version}") or ""]
    candidates += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python")))
    candidates += [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    for python in dict.fromkeys(c for c in candidates if c and os.access(c, os.X_OK)):
        if _version_of(python) == version:
            return python
    raise BuildError(
        f"no Python {version} on the controller to build for the hosts' Python {version}; "
        "install it (with its headers) on the controller"
    )


def _download(url: str, dest: Path, headers: Mapping[str, str]) -> None:
    """``url`` into ``dest``, credentials never carried by a redirect to another origin."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers=dict(headers))
    try:
        with opener().open(request, timeout=60) as response, open(dest, "wb") as out:
            shutil.copyfileobj(response, out)
    except (urllib.error.URLError, OSError) as e:
        raise BuildError(f"{url}: cannot download ({e})") from None


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
        interpreter = find_python(python)
        with tempfile.TemporaryDirectory(prefix="servefleet-build-") as tmp:
            src = Path(tmp) / sdist["url"].rsplit("/", 1)[-1]
            _download(sdist["url"], src, _auth_headers(st, sdist["url"], user, password))
            got = sha256_of(src)
            if got != want:
                raise BuildError(
                    f"{name}=={version}: the lock has sha256:{want}, the index served "
                    f"sha256:{got}; nothing built"
                )
            _uv_build(st, src, interpreter, Path(tmp) / "dist")
            wheels = list((Path(tmp) / "dist").glob("*.whl"))
            if len(wheels) != 1:
                raise BuildError(f"{name}=={version}: the build made no single wheel")
            shutil.move(str(wheels[0]), out / wheels[0].name)
            record = {"wheel": wheels[0].name, "sha256": sha256_of(out / wheels[0].name)}
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


def _uv_build(st: Stack, sdist: Path, python: str, dist: Path) -> None:
    from servefleet.uvbin import uv_binary

    inp = st.inputs
    # build dependencies come from the indexes without auth: the build backend runs with no
    # credentials, and an index asked without them answers 401 (which stops uv)
    free = [i for i in inp["indexes"] if not i["auth"]]
    indexes = [a for i in free for a in ("--index", f"{i['name']}={i['url']}")]
    if inp["public_index"]:
        indexes += ["--default-index", inp["public_index"]]
    insecure = [a for h in inp["trusted_hosts"] for a in ("--allow-insecure-host", h)]
    # the sdist's build backend runs in this environment: the allow-list, no credentials (a
    # build dependency on an index with auth fails in one line)
    env = child_env({"UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"})
    cmd = [str(uv_binary()), "build", "--wheel", "--no-config", "--python", python,
           *indexes, *insecure, "--out-dir", str(dist), str(sdist)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        said = [
            line for line in (proc.stdout + proc.stderr).splitlines() if "cannot be built" in line
        ]
        raise BuildError(
            f"{sdist.name}: the build failed on the controller: "
            f"{said[-1].strip() if said else last_error(proc.stderr)}"
        )
