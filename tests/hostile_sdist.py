"""A hostile sdist for tests: dynamic metadata (so a resolver must build it) and a build backend
that reports every secret it can reach (#31 finding 2). Shared by the unit and the lab tests."""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

BACKEND = r"""
import glob, json, os

REPORT = @REPORT@
SECRETS = @SECRETS@
FILES = @FILES@
NAME, VERSION, DIST = @NAME@, @VERSION@, @DIST@


def _spy(hook):
    found = []
    for k, v in os.environ.items():
        if any(s in v for s in SECRETS) or k.startswith("UV_INDEX_"):
            found.append("env " + k)
    seen = []
    for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
        seen.append(path)
        try:
            data = open(path, "rb").read().decode("utf-8", "replace")
        except OSError:
            continue
        if any(s in data for s in SECRETS):
            found.append(path)
    for path in FILES:
        try:
            open(path, "rb").read(1)
            found.append("read " + path)
        except OSError:
            pass
    name = os.path.join(REPORT, "%s-%d.json" % (hook, os.getpid()))
    with open(name, "w") as f:
        json.dump({"hook": hook, "uid": os.getuid(), "found": found, "procs": seen}, f)


METADATA = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n%s" % (NAME, VERSION, @REQUIRES@)


def get_requires_for_build_wheel(config_settings=None):
    _spy("requires")
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _spy("build_wheel")
    import zipfile
    name = "%s-%s-py3-none-any.whl" % (DIST, VERSION)
    info = "%s-%s.dist-info/" % (DIST, VERSION)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        z.writestr(DIST + "/__init__.py", "")
        z.writestr(info + "METADATA", METADATA)
        z.writestr(info + "WHEEL",
                   "Wheel-Version: 1.0\nGenerator: evil\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(info + "RECORD", "")
    return name
"""


def _tar_add(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def hostile_sdist(
    directory: Path,
    report: Path,
    secrets: Iterable[str],
    files: Iterable[str | Path] = (),
    name: str = "evil",
    version: str = "0.1",
    requires: Iterable[str] = (),
) -> Path:
    """``<name>-<version>.tar.gz`` in ``directory``: ``Dynamic: Requires-Dist`` (so uv must build
    it to learn ``requires``), an in-tree backend that writes to ``report`` what it found: an
    environment variable holding one of ``secrets`` or named ``UV_INDEX_*``, a
    ``/proc/<pid>/environ`` or ``cmdline`` holding one, each of ``files`` it could open, its uid
    and the processes it saw.

    + directory: where the sdist goes (an index's directory)
    + report: a directory the build user can write (mode 1777)
    + secrets: the values to look for
    + files: paths it must not be able to read
    + name, version: the distribution
    + requires: its dependencies, known only once it is built
    """
    dist = name.replace("-", "_")
    backend = (
        BACKEND.replace("@REPORT@", repr(str(report)))
        .replace("@SECRETS@", repr(list(secrets)))
        .replace("@FILES@", repr([str(f) for f in files]))
        .replace("@NAME@", repr(name))
        .replace("@VERSION@", repr(version))
        .replace("@DIST@", repr(dist))
        .replace("@REQUIRES@", repr("".join(f"Requires-Dist: {r}\n" for r in requires)))
    )
    path = directory / f"{dist}-{version}.tar.gz"
    top = f"{dist}-{version}"
    with tarfile.open(path, "w:gz") as tar:
        _tar_add(tar, f"{top}/PKG-INFO",
                 f"Metadata-Version: 2.2\nName: {name}\nVersion: {version}\nDynamic: Requires-Dist\n")  # fmt: skip
        _tar_add(tar, f"{top}/pyproject.toml",
                 '[build-system]\nrequires = []\nbuild-backend = "evil_backend"\n'
                 f'backend-path = ["."]\n\n[project]\nname = "{name}"\nversion = "{version}"\n'
                 'dynamic = ["dependencies"]\n')  # fmt: skip
        _tar_add(tar, f"{top}/evil_backend.py", backend)
    return path


def reports(report: Path) -> list[dict[str, Any]]:
    """What each backend hook that ran wrote (none: no index code ran)."""
    return [json.loads(p.read_text()) for p in sorted(report.glob("*.json"))]


def report_dir() -> Path:
    """A new directory in /tmp the build user (nobody, as root) can write."""
    report = Path(tempfile.mkdtemp(prefix="servefleet-spy-", dir="/tmp"))
    report.chmod(0o1777)
    return report
