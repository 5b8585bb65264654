"""The simulated RBLN driver runfiles: ``rebellions-x86_64-<version>.run`` of each driver
version, the runfile template with the simulated rbln-smi inside."""

from __future__ import annotations

from pathlib import Path

from .inputs import SIMULATOR

DRIVER_VERSIONS = ["3.5.1", "3.6.0"]


def build_runfiles(driver_dir: Path) -> dict[str, Path]:
    """rebellions-x86_64-<ver>.run for every driver version."""
    template = (SIMULATOR / "driver" / "runfile.sh").read_text()
    smi = (SIMULATOR / "driver" / "rbln_smi.py").read_text()
    driver_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for version in DRIVER_VERSIONS:
        text = template.replace("@RBLN_SMI@", smi.rstrip("\n")).replace("@VERSION@", version)
        path = driver_dir / f"rebellions-x86_64-{version}.run"
        path.write_text(text)
        path.chmod(0o755)
        out[version] = path
    return out
