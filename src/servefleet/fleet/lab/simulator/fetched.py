"""The real wheels the lab's public index serves besides the simulated ones (not simulated:
they need no NPU): the setuptools wheel the arctic-inference sdist builds with, vLLM's router and
the Hugging Face client with their dependencies, and uv for the hosts. Each is fetched once
with ``pip download`` and the machine's own pip config, and cached under
/var/cache/servefleet-lab/wheels."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WHEEL_CACHE = Path(os.environ.get("SERVEFLEET_LAB_WHEEL_CACHE", "/var/cache/servefleet-lab/wheels"))


def _setuptools_ok(path: Path) -> bool:
    m = re.match(r"setuptools-(\d+)\.(\d+)", path.name)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (70, 1)  # type: ignore[union-attr]


def setuptools_wheel() -> Path:
    """A setuptools wheel new enough (>= 70.1) to build without the ``wheel`` package: from
    the cache, else fetched once with ``pip download`` and the machine's own pip config."""
    cached = sorted(p for p in WHEEL_CACHE.glob("setuptools-*.whl") if _setuptools_ok(p))
    if cached:
        return cached[-1]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WHEEL_CACHE) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--dest", tmp, "setuptools>=70.1"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = [p for p in Path(tmp).glob("setuptools-*.whl") if _setuptools_ok(p)]
        if proc.returncode != 0 or not found:
            raise RuntimeError(
                "cannot fetch the setuptools wheel the arctic-inference sdist builds with: "
                + (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            )
        target = WHEEL_CACHE / found[0].name
        os.replace(found[0], target)
    return target


# Real packages (not simulated: they need no NPU), fetched once for every Python a lock resolves
# for: vLLM's router at servefleet's default serve_router_version, and the Hugging Face client
# that vllm pulls in (a hub fetch runs its snapshot_download against the lab's hub)
ROUTER_REQUIREMENT = "vllm-router==0.1.17"
HUB_REQUIREMENT = "huggingface-hub==2.4.0"
REAL_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# What their dependencies need on Python 3.10 only: pip evaluates `python_version` markers for
# the Python it runs with (3.11 here), so it would not fetch them; a lock (uv, universal) needs
# them (`uv pip compile --universal --python-version 3.10` lists them)
PY310_ONLY = {ROUTER_REQUIREMENT: ("async-timeout", "exceptiongroup"), HUB_REQUIREMENT: ("tomli",)}


def host_uv_versions() -> list[str]:
    """The uv versions the lab's public index serves for the hosts: those ``lab up`` names in
    SERVEFLEET_LAB_UV_VERSIONS (servefleet.fleet.lab.artifacts.host_uv_versions: the controller's
    and each lock's), else the controller's."""
    from servefleet.release.uvbin import uv_version

    named = os.environ.get("SERVEFLEET_LAB_UV_VERSIONS", "")
    versions = [v for v in named.split(",") if re.fullmatch(r"[0-9]+(\.[0-9]+)*", v)]
    return sorted(set(versions)) or [uv_version()]


def host_uv_wheel(version: str) -> Path:
    """The real uv wheel of ``version`` for the lab's hosts (manylinux x86_64), which the hosts
    take their uv from: from the cache, else fetched once with ``pip download`` and the
    machine's own pip config.

    + version: a uv version (:func:`host_uv_versions`)
    """
    cache = WHEEL_CACHE / f"uv-{version}-host"
    if not (cache / ".complete").is_file():
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=WHEEL_CACHE, prefix=".uv-"))
        try:
            cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps",
                   "--platform", "manylinux_2_17_x86_64", "--python-version", "3.11",
                   "--dest", str(tmp), f"uv=={version}"]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0 or len(list(tmp.glob("uv-*.whl"))) != 1:
                said = [x for x in proc.stderr.splitlines() if x.strip()] or ["no wheel"]
                raise RuntimeError(f"cannot fetch uv=={version} for the hosts: {said[-1]}")
            (tmp / ".complete").write_text("")
            shutil.rmtree(cache, ignore_errors=True)
            os.replace(tmp, cache)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    (wheel,) = cache.glob("uv-*.whl")
    return wheel


PINS = Path(__file__).resolve().parent / "real_pins.json"  # requirement -> Python -> name==version


def pinned(requirement: str) -> dict[str, list[str]]:
    """The exact versions of requirement's tree for each Python of REAL_PYTHONS, as
    ``real_pins.json`` holds them (so a fresh machine's lab serves the same wheels, whatever the
    index has published since; ``python3 fetched.py --write-pins`` takes the newest on purpose).

    + requirement: ``name==version``, a key of PY310_ONLY
    """
    return dict(json.loads(PINS.read_text())[requirement])


def newest_pins(requirement: str) -> dict[str, list[str]]:
    """What ``pip download`` resolves requirement's tree to today, for each Python.

    + requirement: ``name==version``, a key of PY310_ONLY
    """
    out = {}
    for python in REAL_PYTHONS:
        more = PY310_ONLY[requirement] if python == "3.10" else ()
        with tempfile.TemporaryDirectory() as tmp:
            _download(["--python-version", python, "--dest", tmp, requirement, *more],
                      f"{requirement} for Python {python}")  # fmt: skip
            names = (w.name.split("-")[:2] for w in Path(tmp).glob("*.whl"))
            out[python] = sorted(f"{re.sub(r'[-_.]+', '-', n).lower()}=={v}" for n, v in names)
    return out


def _download(args: list[str], what: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        said = [x for x in proc.stderr.splitlines() if x.strip()
                and not x.startswith("WARNING:")] or ["no wheel"]  # fmt: skip
        raise RuntimeError(f"cannot fetch {what}: {said[-1]}")


def real_wheels(requirement: str) -> list[Path]:
    """The wheel of requirement and its dependencies' wheels at the versions :func:`pinned`
    names, for every Python of REAL_PYTHONS: from the cache, else fetched once with
    ``pip download --no-deps`` and the machine's own pip config.

    + requirement: ``name==version``, a key of PY310_ONLY
    """
    pins = pinned(requirement)
    digest = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()[:8]
    cache = WHEEL_CACHE / f"{requirement.replace('==', '-')}-{digest}"
    if not (cache / ".complete").is_file():
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=WHEEL_CACHE, prefix=".real-"))
        try:
            for python in REAL_PYTHONS:
                _download(["--no-deps", "--python-version", python, "--dest", str(tmp),
                           *pins[python]], f"{requirement} for Python {python}")  # fmt: skip
            (tmp / ".complete").write_text("")
            shutil.rmtree(cache, ignore_errors=True)
            os.replace(tmp, cache)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return sorted(cache.glob("*.whl"))


if __name__ == "__main__" and sys.argv[1:] == ["--write-pins"]:
    PINS.write_text(
        json.dumps({r: newest_pins(r) for r in PY310_ONLY}, indent=1, sort_keys=True) + "\n"
    )
