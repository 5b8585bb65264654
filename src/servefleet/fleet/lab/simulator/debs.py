"""The Debian stand-ins of the lab's apt repository: dkms and linux-headers-<this kernel>
packages that only satisfy the RBLN driver runfile's prerequisite check."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from .archives import EPOCH


def kernel_release() -> str:
    return os.uname().release


def _deb(outdir: Path, name: str, version: str, description: str, files: dict[str, str]) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        control = (
            f"Package: {name}\nVersion: {version}\nArchitecture: all\n"
            "Maintainer: servefleet lab <lab@servefleet.invalid>\nSection: misc\n"
            f"Priority: optional\nDescription: {description}\n"
            " A SIMULATION for the servefleet lab: it only satisfies the RBLN driver\n"
            " runfile's prerequisite check.\n"
        )
        (root / "DEBIAN" / "control").write_text(control)
        for rel, text in files.items():
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(0o755 if text.startswith("#!") else 0o644)
        outdir.mkdir(parents=True, exist_ok=True)
        path = outdir / f"{name}_{version}_all.deb"
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(EPOCH))
        cmd = ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(path)]
        subprocess.run(cmd, check=True, capture_output=True, env=env)
    return path


def build_debs(apt: Path) -> str:
    """dkms and linux-headers-<this kernel> stand-ins; returns the headers package name."""
    release = kernel_release()
    headers = f"linux-headers-{release}"
    dkms = "#!/bin/sh\n# dkms: a SIMULATION for the servefleet lab; builds nothing.\n"
    dkms += 'echo "dkms (servefleet lab stand-in): $*"\n'
    _deb(
        apt,
        "dkms",
        "3.0.10-8+sim1",
        "DKMS stand-in (servefleet lab simulation)",
        {"usr/sbin/dkms": dkms},
    )
    note = f"servefleet lab simulation: stand-in for the kernel headers of {release}\n"
    _deb(
        apt,
        headers,
        "1.0+sim1",
        f"kernel headers stand-in for {release} (servefleet lab)",
        {f"usr/src/{headers}/SERVEFLEET-LAB-SIMULATION": note},
    )
    return headers
