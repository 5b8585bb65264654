"""The RBLN driver (KMD) as a driver change: Rebellions' runfile, fetched by ``driver_runfile_url``
and checked against ``driver_sha256``, run with ``driver_installer_args`` after the apt packages
it builds its kernel module with (``driver_apt_packages``, from ``driver_apt_repo`` when set),
then ``rbln-smi -j`` must report ``driver_version`` (its ``KMD_version``). Pure: the driver step
(:mod:`servefleet.entry.steps.driver`) turns the plan into operations.
"""

from __future__ import annotations

from servefleet.base.remote.layout import RUNFILE_DIR
from servefleet.platforms.base import DriverFile, DriverPlan, Wants

# what reports the installed driver: rbln-smi's JSON names it KMD_version
VERSION_CHECK = (("rbln-smi", "-j"), "KMD_version")


def runfile_of(version: str) -> str:
    """Where a host keeps the runfile of driver ``version``."""
    return f"{RUNFILE_DIR}/rebellions-x86_64-{version}.run"


def driver_problem(settings: Wants) -> str | None:
    """What the data lacks to install the driver: the runfile's URL, or its sha256."""
    s = settings
    if not s.driver_runfile_url:
        return f"driver_runfile_url: not set; needed to install driver {s.driver_version}"
    if s.driver_version not in s.driver_sha256:
        known = ", ".join(sorted(s.driver_sha256)) or "none"
        return f"driver_sha256: no sha256 for driver {s.driver_version} (known: {known})"
    return None


def driver_plan(settings: Wants, kernel: str) -> DriverPlan:
    """The runfile install of ``driver_version`` (its data checked by :func:`driver_problem`).

    + settings: the host's validated data
    + kernel: the host's kernel release: its headers package (``{kernel}``)
    """
    s = settings
    version = s.driver_version
    runfile = runfile_of(version)
    return DriverPlan(
        version=version,
        install=("sh", runfile, *s.driver_installer_args),
        log=f"{RUNFILE_DIR}/install-{version}.log",
        check=VERSION_CHECK,
        apt_packages=tuple(p.format(kernel=kernel) for p in s.driver_apt_packages),
        apt_repo=s.driver_apt_repo,
        installer=DriverFile(
            what="runfile",
            url=(s.driver_runfile_url or "").format(version=version),
            sha256=s.driver_sha256.get(version, ""),
            dest=runfile,
        ),
    )
