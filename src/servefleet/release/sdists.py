"""Code from an index, run on the controller only here: ``uv build`` of an sdist in the sandbox
(``servefleet.base.sandbox``), with no credential in its process tree. Used for the wheels hosts
install in place of an sdist (``servefleet.release.builds``) and for the metadata of an sdist whose
dependencies are dynamic, which ``uv lock`` would otherwise build in a process that holds the
index credentials (``servefleet.release.resolve``, #31 finding 2).

Controller-side; imports no pyinfra.
"""

from __future__ import annotations

import email.parser
import glob
import os
import re
import shutil
import stat
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servefleet.base import sandbox
from servefleet.base.download import opener, unreachable
from servefleet.base.errors import ServefleetError
from servefleet.base.remote import retry
from servefleet.release.uvbin import last_error, uv_binary


def fetch(url: str, dest: Path, headers: Mapping[str, str]) -> None:
    """``url`` into ``dest``, credentials never carried by a redirect to another origin.

    + url: what to download
    + dest: the file to write
    + headers: the request's headers (credentials chosen by ``url``'s origin)
    """
    request = urllib.request.Request(url, headers=dict(headers))

    def once() -> None:
        with opener().open(request, timeout=60) as response, open(dest, "wb") as out:
            shutil.copyfileobj(response, out)
            retry.check_whole(response)

    try:
        retry.attempts(once)
    except retry.GaveUp as e:
        raise unreachable(url, e.last) from None
    except (urllib.error.URLError, OSError) as e:
        raise SdistError(f"{url}: cannot download ({e})") from None


class SdistError(ServefleetError):
    """An sdist that cannot be built on the controller (one line)."""


def _version_of(python: str, space: sandbox.Workspace) -> str | None:
    """``python``'s major.minor when the build user's uv can use it (uv must reach every file of
    it: a venv whose home it cannot read, or a binary under root's home, it cannot)."""
    query = "import sys; print('%d.%d' % sys.version_info[:2])"
    out = None
    for cmd in ([str(space.path / "uv"), "python", "find", "--no-config", python],
                [python, "-c", query]):  # fmt: skip
        try:
            out = space.run(cmd, {"UV_PYTHON_DOWNLOADS": "never"}, timeout=30)
        except OSError:
            return None
        if out.returncode != 0:
            return None
    return out.stdout.strip() if out else None


def find_python(version: str, space: sandbox.Workspace) -> str:
    """A controller interpreter of Python ``version`` (``3.11``) with its headers, one the build
    user can run (asked in the sandbox).

    + version: major.minor of the hosts' sdk_python
    + space: the sandbox's workspace, uv in it (``space.put(uv_binary())``)
    """
    if not re.fullmatch(r"3\.\d+", version):
        raise SdistError(f"cannot build for Python {version!r}")
    # base interpreters, never a venv's (uv builds in its own; a venv's home may be out of reach)
    candidates = [getattr(sys, "_base_executable", ""), shutil.which(f"python{version}") or ""]
    candidates += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python")))
    candidates += [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    real = (os.path.realpath(c) for c in candidates if c)
    for python in dict.fromkeys(c for c in real if os.access(c, os.X_OK)):
        if _version_of(python, space) == version:
            return python
    raise SdistError(
        f"no Python {version} on the controller that the build user ({sandbox.BUILD_USER}) can "
        f"run to build for the hosts' Python "
        f"{version}; install it (with its headers) on the controller"
    )


def build_wheel(inputs: Mapping[str, Any], sdist: Path, python: str, out: Path) -> Path:
    """The one wheel ``uv build`` makes of ``sdist`` for Python ``python``, in the sandbox (no
    credential in its process tree, none of the controller's processes in sight, none of root's
    files; refused when the controller is not root). Build dependencies come from the stack's
    indexes without auth; one on an index with auth fails the build in one line.

    + inputs: the stack's inputs (its indexes: ``Stack.inputs``)
    + sdist: the sdist, its sha256 checked
    + python: major.minor
    + out: the directory the wheel is copied to
    """
    with sandbox.workspace(sdist.name) as space:
        uv = space.put(uv_binary(), 0o500)
        interpreter = find_python(python, space)
        src = space.put(sdist)
        free = [i for i in inputs["indexes"] if not i["auth"]]
        indexes = [a for i in free for a in ("--index", f"{i['name']}={i['url']}")]
        if inputs["public_index"]:
            indexes += ["--default-index", inputs["public_index"]]
        insecure = [a for h in inputs["trusted_hosts"] for a in ("--allow-insecure-host", h)]
        dist = space.path / "dist"
        cmd = [str(uv), "build", "--wheel", "--no-config", "--python", interpreter,
               *indexes, *insecure, "--out-dir", str(dist), str(src)]  # fmt: skip
        proc = space.run(cmd, {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"})
        if proc.returncode != 0:
            said = [
                line
                for line in (proc.stdout + proc.stderr).splitlines()
                if "cannot be built" in line
            ]
            raise SdistError(
                f"{sdist.name}: the build failed on the controller: "
                f"{said[-1].strip() if said else last_error(proc.stderr)}"
            )
        return take_wheel(dist, out, space.ids, sdist.name)


def take_wheel(dist: Path, out: Path, ids: tuple[int, int] | None, what: str) -> Path:
    """The one wheel in ``dist`` (the build user's directory) copied to ``out``, read through
    descriptors that follow no link: a build that planted a link there (``dist`` itself, or the
    wheel) makes root read nothing else. As root, the file must be the build user's.

    + dist: where ``uv build`` left the wheel
    + out: the controller's directory it is copied to
    + ids: the build user (None: the controller's own)
    + what: the sdist's name (for the message)
    """
    try:
        dfd = os.open(dist, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        raise SdistError(f"{what}: the build made no single wheel") from None
    try:
        names = [n for n in os.listdir(dfd) if n.endswith(".whl")]
        if len(names) != 1:
            raise SdistError(f"{what}: the build made no single wheel")
        try:
            fd = os.open(names[0], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        except OSError:
            raise SdistError(f"{what}: the build's wheel is not a plain file") from None
        with os.fdopen(fd, "rb") as src:
            st = os.fstat(src.fileno())
            if not stat.S_ISREG(st.st_mode) or (ids is not None and st.st_uid != ids[0]):
                raise SdistError(f"{what}: the build's wheel is not a plain file of the build user")
            wheel = out / os.path.basename(names[0])
            with open(wheel, "wb") as dest:
                shutil.copyfileobj(src, dest)
    finally:
        os.close(dfd)
    return wheel


def metadata(wheel: Path) -> dict[str, Any]:
    """What ``[[tool.uv.dependency-metadata]]`` needs of a built wheel: name, version,
    requires-dist, requires-python and provides-extras, from its ``METADATA``.

    + wheel: the wheel
    """
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(names) != 1:
                raise SdistError(f"{wheel.name}: no single .dist-info/METADATA")
            text = z.read(names[0]).decode("utf-8", "replace")
    except (OSError, zipfile.BadZipFile) as e:
        raise SdistError(f"{wheel.name}: not a wheel ({e})") from None
    msg = email.parser.Parser().parsestr(text, headersonly=True)
    out: dict[str, Any] = {
        "name": str(msg.get("Name", "")),
        "version": str(msg.get("Version", "")),
        "requires-dist": [str(r) for r in msg.get_all("Requires-Dist") or []],
    }
    if msg.get("Requires-Python"):
        out["requires-python"] = str(msg["Requires-Python"])
    if msg.get_all("Provides-Extra"):
        out["provides-extras"] = [str(x) for x in msg.get_all("Provides-Extra") or []]
    return out
