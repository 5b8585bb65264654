"""The shared base image of the lab hosts: Debian minbase plus what a fresh Debian server has,
built with mmdebstrap from this machine's own apt mirror (never a hard-coded one) and cached."""

from __future__ import annotations

import hashlib
import subprocess
from importlib import resources
from pathlib import Path

from servefleet.lab.state import LabError

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
)


def script(name: str) -> Path:
    """Path of a shell script shipped in ``servefleet/lab/scripts``.

    + name: the script's file name
    """
    return Path(str(resources.files("servefleet.lab") / "scripts" / name))


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


def ensure_base(cache_dir: Path) -> Path:
    """Build (or unpack from the cache, or reuse) the base image; return its directory.

    + cache_dir: where the tarball and the unpacked base live
    """
    mirror, suite = find_mirror()
    key = base_key(mirror, suite)
    out = cache_dir / "base"
    proc = subprocess.run(
        [
            "bash",
            str(script("build-base.sh")),
            str(out),
            str(cache_dir),
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
        raise LabError(f"building the lab base image failed: {tail[0]}")
    for old in cache_dir.glob("base-*.tar.zst"):
        if old.name != f"base-{key}.tar.zst":
            old.unlink()
    return out
