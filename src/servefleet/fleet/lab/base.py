"""The shared base image of the lab hosts: Debian minbase plus what a fresh Debian server has,
built with mmdebstrap from this machine's own apt mirror (never a hard-coded one) and cached."""

from __future__ import annotations

import hashlib
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

from servefleet.fleet.lab.state import LabError

# What a fresh Debian server has (minbase brings tar, gzip, apt, dpkg). Not curl, not dkms:
# those come from the lab's apt repository, as the deploy installs them.
BASE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",
    "python3-pip",
    "ca-certificates",
    "iproute2",
    "gnupg",
    "sudo",
    # the router's proxy and its guard (nft): a fleet's hosts install them from their Debian
    # mirror when a router is wanted; lab hosts have no mirror, so their image holds them (the
    # deploy finds them installed)
    "nginx-light",
    "nftables",
)
# The Debian suites a lab host can run (`lab up --base`, `--odd-base`): their glibc and Python
SUITES = {"bookworm": ("2.36", "3.11"), "trixie": ("2.41", "3.13")}
DEFAULT_SUITE = "bookworm"


def base_note(host: dict[str, Any]) -> str:
    """`` (trixie: glibc 2.41)`` for a lab host on another base than the default, else nothing.

    + host: an entry of the lab state's ``hosts``
    """
    suite = host.get("base", DEFAULT_SUITE)
    return "" if suite == DEFAULT_SUITE else f" ({suite}: glibc {SUITES[suite][0]})"


def script(name: str) -> Path:
    """Path of a shell script shipped in ``servefleet/fleet/lab/scripts``.

    + name: the script's file name
    """
    return Path(str(resources.files("servefleet.fleet.lab") / "scripts" / name))


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    key = ""
    for line in text.splitlines() + [""]:
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                stanzas.append(current)
            current, key = {}, ""
        elif line[0] in " \t" and key:
            current[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            current[key] = value.strip()
    return stanzas


def find_mirror(
    sources_dir: Path = Path("/etc/apt/sources.list.d"),
    sources_list: Path = Path("/etc/apt/sources.list"),
) -> tuple[str, str]:
    """``(mirror URI, suite)`` of this machine's main Debian archive, from its apt sources.

    Security and updates suites are passed over. Raises LabError when none is configured.

    + sources_dir: deb822 ``*.sources`` files (read first)
    + sources_list: one-line-style sources
    """
    candidates: list[tuple[str, str]] = []
    for path in sorted(sources_dir.glob("*.sources")) if sources_dir.is_dir() else []:
        for stanza in _deb822_stanzas(path.read_text(errors="replace")):
            if stanza.get("enabled", "yes").lower() == "no":
                continue
            if "deb" not in stanza.get("types", "").split():
                continue
            if "main" not in stanza.get("components", "").split():
                continue
            for uri in stanza.get("uris", "").split():
                for suite in stanza.get("suites", "").split():
                    candidates.append((uri, suite))
    if sources_list.is_file():
        for line in sources_list.read_text(errors="replace").splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) >= 4 and words[0] == "deb" and "main" in words[3:]:
                uri_at = 1
                while uri_at < len(words) and words[uri_at].startswith("["):
                    # options: [arch=amd64 signed-by=...] (possibly several words)
                    while not words[uri_at].endswith("]"):
                        uri_at += 1
                    uri_at += 1
                if uri_at + 1 < len(words):
                    candidates.append((words[uri_at], words[uri_at + 1]))
    for uri, suite in candidates:
        if "-" not in suite and "/" not in suite:
            return uri.rstrip("/"), suite
    raise LabError(
        "no Debian mirror with a main suite in /etc/apt/sources.list.d/*.sources or "
        "/etc/apt/sources.list; the lab builds its base image from the machine's own mirror"
    )


def base_key(mirror: str, suite: str) -> str:
    """Cache key of the base image: the build script, the package list, the mirror and suite.

    + mirror: the Debian mirror URI
    + suite: the Debian suite (e.g. bookworm)
    """
    digest = hashlib.sha256(script("build-base.sh").read_bytes())
    digest.update(f"{' '.join(BASE_PACKAGES)}|{mirror}|{suite}".encode())
    return digest.hexdigest()[:16]


def base_paths(cache_dir: Path, suite: str) -> tuple[Path, Path]:
    """``(unpacked root, tarball directory)`` of the base image of a suite: the default suite
    keeps the layout earlier labs cached (``cache_dir/base``, ``cache_dir/base-KEY.tar.zst``);
    another suite lives in ``cache_dir/base-SUITE/`` (``root/`` and its tarball).

    + cache_dir: the lab cache
    + suite: a suite of :data:`SUITES`
    """
    if suite == DEFAULT_SUITE:
        return cache_dir / "base", cache_dir
    return cache_dir / f"base-{suite}" / "root", cache_dir / f"base-{suite}"


def ensure_base(cache_dir: Path, suite: str = DEFAULT_SUITE) -> Path:
    """Build (or unpack from the cache, or reuse) the base image of a Debian suite; return its
    directory. It is built from this machine's own mirror, which serves every suite of SUITES.

    + cache_dir: where the tarball and the unpacked base live
    + suite: bookworm (glibc 2.36, Python 3.11) or trixie (glibc 2.41, Python 3.13)
    """
    if suite not in SUITES:
        raise LabError(f"--base {suite}: unknown base; allowed: {', '.join(SUITES)}")
    mirror, _machine_suite = find_mirror()
    key = base_key(mirror, suite)
    out, tarballs = base_paths(cache_dir, suite)
    tarballs.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            "bash",
            str(script("build-base.sh")),
            str(out),
            str(tarballs),
            key,
            mirror,
            suite,
            ",".join(BASE_PACKAGES),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LabError(f"building the lab base image ({suite}) failed: {tail[0]}")
    for old in tarballs.glob("base-*.tar.zst"):
        if old.name != f"base-{key}.tar.zst":
            old.unlink()
    return out
