"""The lab's package sources: the simulated packages and model store that the simulator
(``servefleet/fleet/lab/simulator/``, shipped in the package, by its ``build.py``) builds, cached by a
hash of the simulator sources and the models added to the store, and the per-lab signed apt
repository made from their .debs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from servefleet.fleet.lab.state import LabError

SOURCES_ENV = "SERVEFLEET_LAB_SOURCES"  # another simulator sources directory (tests, development)
PACKAGE_SOURCES = Path(str(resources.files("servefleet.fleet.lab") / "simulator"))
APT_KEY_NAME = "servefleet lab archive (simulation)"


def simulator_sources() -> Path:
    """The simulator sources directory: ``$SERVEFLEET_LAB_SOURCES`` or the package's
    ``servefleet/fleet/lab/simulator/``."""
    path = Path(os.environ.get(SOURCES_ENV) or PACKAGE_SOURCES)
    if not (path / "build.py").is_file():
        raise LabError(
            f"no simulator sources at {path} (expected {path / 'build.py'}); reinstall "
            f"servefleet, or set {SOURCES_ENV}"
        )
    return path


def sources_key(sources: Path) -> str:
    """Hash of every file under the simulator sources and of the vLLM reference data its build
    copies into the simulated vllm (``reference/`` of the servefleet package around it), names
    and contents.

    + sources: the simulator sources directory
    """
    digest = hashlib.sha256()
    reference = sources.parents[2] / "reference"  # servefleet/fleet/lab/simulator -> servefleet
    for top, prefix in ((sources, ""), (reference, "../reference/")):
        for path in sorted(top.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update((prefix + str(path.relative_to(top))).encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


UV_VERSIONS = "SERVEFLEET_LAB_UV_VERSIONS"  # build.py's input: the uv versions its index serves


def host_uv_versions(locks: Path = Path("locks")) -> list[str]:
    """The uv versions the lab's public index serves for the hosts: the controller's, and the
    one each lock under ``locks`` (the fleet repository's, where ``lab up`` runs) pins: the hosts
    run a lock's uv whatever the controller has (#53), so a controller with a newer uv still
    deploys the committed lab lock.

    + locks: the directory of lock directories
    """
    from servefleet.release.uvbin import uv_version

    versions = {uv_version()}
    for path in sorted(locks.glob("*/servefleet.lock.json")):
        try:
            pinned = (json.loads(path.read_text()).get("uv") or {}).get("version")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(pinned, str) and re.fullmatch(r"[0-9]+(\.[0-9]+)*", pinned):
            versions.add(pinned)
    return sorted(versions)


def artifacts_key(sources: Path, models: Sequence[str] = (), uv: Sequence[str] = ()) -> str:
    """The name of a build: the sources' key, then a hash of the models added to the store and
    of the uv versions served besides the controller's.

    + sources: the simulator sources directory
    + models: org/name ids the store holds besides the recipes' models
    + uv: the uv versions the index serves (:func:`host_uv_versions`)
    """
    key = sources_key(sources)
    if len(uv) > 1:  # first: a build with models added starts with the name of one without
        key += "-uv" + hashlib.sha256(",".join(uv).encode()).hexdigest()[:8]
    if models:
        added = ",".join(sorted(set(models))).encode()
        key += "-" + hashlib.sha256(added).hexdigest()[:12]
    return key


def ensure_artifacts(cache_dir: Path, models: Sequence[str] = ()) -> tuple[Path, dict[str, Any]]:
    """Build the lab artifacts (or reuse the cached build); return their directory and manifest.

    Builds of other simulator sources are removed; builds of these sources with other models
    stay, so a lab up with or without ``--models`` after the other starts warm.

    + cache_dir: the lab cache; builds live in ``cache_dir/artifacts/<key>``
    + models: org/name ids the store holds besides the recipes' models
    """
    sources = simulator_sources()
    root = cache_dir / "artifacts"
    uv = host_uv_versions()
    out = root / artifacts_key(sources, models, uv)
    if not (out / "manifest.json").is_file():
        same_sources = sources_key(sources)
        for old in root.iterdir() if root.is_dir() else []:
            if old == out or not old.name.startswith(same_sources) or old.suffix == ".tmp":
                shutil.rmtree(old, ignore_errors=True)
        tmp = Path(str(out) + ".tmp")
        tmp.mkdir(parents=True)
        proc = subprocess.run(
            [sys.executable, str(sources / "build.py"), str(tmp), *sorted(set(models))],
            capture_output=True,
            text=True,
            cwd=tmp,
            env={**os.environ, UV_VERSIONS: ",".join(uv)},
        )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise LabError(f"building the lab artifacts ({sources}/build.py) failed: {tail[0]}")
        if not (tmp / "manifest.json").is_file():
            raise LabError(f"{sources}/build.py wrote no manifest.json")
        tmp.rename(out)
    return out, json.loads((out / "manifest.json").read_text())


def serving_copy(src: Path, dst: Path) -> None:
    """A lab's own copy of built index directories: the same tree, each file hard-linked to the
    build's (copied where a link cannot be made), so a lab that replaces a file
    (``servefleet lab republish``) renames over its own name and never writes the cache.

    + src: the build's ``index/`` directory
    + dst: the lab's copy (replaced)
    """
    shutil.rmtree(dst, ignore_errors=True)
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)


def _run(cmd: list[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(cmd, capture_output=True, **kwargs)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()[-1:]
        raise LabError(f"{what} failed: {tail[0] if tail else 'no output'}")
    return proc


def make_apt_repo(debs: Path, repo: Path, key_file: Path) -> None:
    """A flat apt repository of the .debs in debs, signed (InRelease) with a key made for it.

    The key is generated in a throwaway GNUPGHOME whose agent is stopped afterwards; only its
    public half is kept (key_file, binary, for ``signed-by``, also served as
    ``/lab-archive-keyring.gpg``).

    + debs: directory holding the .deb files
    + repo: the repository directory to create (replaced)
    + key_file: where to write the public key
    """
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    for deb in sorted(debs.glob("*.deb")):
        shutil.copy2(deb, repo / deb.name)
    packages = _run(
        ["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], "dpkg-scanpackages", cwd=repo
    ).stdout
    (repo / "Packages").write_bytes(packages)
    _run(["gzip", "-kf", "Packages"], "gzip Packages", cwd=repo)
    # never let apt-ftparchive write into the repo: Release would list itself
    release = _run(["apt-ftparchive", "release", "."], "apt-ftparchive release", cwd=repo).stdout
    (repo / "Release").write_bytes(release)
    with tempfile.TemporaryDirectory(prefix="servefleet-lab-gnupg-") as home:
        env = dict(os.environ, GNUPGHOME=home)
        gpg = ["gpg", "--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", ""]
        try:
            _run(
                gpg + ["--quick-gen-key", APT_KEY_NAME, "ed25519", "sign", "never"],
                "gpg key generation",
                env=env,
            )
            _run(
                gpg
                + ["--yes", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release")],
                "signing the apt Release",
                env=env,
            )
            _run(
                gpg
                + [
                    "--yes",
                    "--detach-sign",
                    "-o",
                    str(repo / "Release.gpg"),
                    str(repo / "Release"),
                ],
                "signing the apt Release",
                env=env,
            )
            public = _run(
                ["gpg", "--batch", "--export", APT_KEY_NAME], "gpg export", env=env
            ).stdout
        finally:
            subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, capture_output=True)
    key_file.write_bytes(public)
    key_file.chmod(0o644)
    (repo / "lab-archive-keyring.gpg").write_bytes(public)
