"""The RBLN driver: when ``rbln-smi -j`` reports another version (or none), its apt
prerequisites, the runfile (fetched or from the wheelhouse, checked against its sha256), this
host's servers stopped, the installer run, the version checked, and the servers of the host's
last good state back through the health gate. A failed install shows the tail of its log and
brings those servers back too."""

from __future__ import annotations

import re
import shlex

from pyinfra.api.operation import OperationMeta
from pyinfra.operations import apt, files, server
from pyinfra.operations.util import any_changed

from servefleet.base.errors import ServefleetError
from servefleet.base.remote.layout import RUNFILE_DIR, UNIT_GLOB
from servefleet.entry.steps.lib import command
from servefleet.hostplan.types import HostPlan


def check_data(plan: HostPlan) -> None:
    """Before any change: the data names the runfile and its sha256 when the driver is needed."""
    s = plan.settings
    if plan.refusal or not plan.driver_needed:
        return
    if not s.driver_runfile_url:
        raise ServefleetError(
            f"driver_runfile_url: not set; needed to install driver {s.driver_version}"
        )
    if s.driver_version not in s.driver_sha256:
        known = ", ".join(sorted(s.driver_sha256)) or "none"
        raise ServefleetError(
            f"driver_sha256: no sha256 for driver {s.driver_version} (known: {known})"
        )


def install(plan: HostPlan) -> OperationMeta | None:
    s = plan.settings
    if not plan.driver_needed:
        return None
    version = s.driver_version
    if s.driver_apt_repo:
        repo = s.driver_apt_repo
        keyring = re.search(r"signed-by=([^\s\]]+)", repo["src"])
        changed = []
        if repo.get("key") and keyring:
            changed.append(
                files.put(
                    name="Install the apt repository key",
                    src=repo["key"],
                    dest=keyring.group(1),
                    mode="644",
                )
            )
        changed.append(
            apt.repo(name="Add the apt repository", src=repo["src"], filename="servefleet-driver")
        )
        apt.update(name="Update apt lists", _if=any_changed(*changed))
    packages = [p.format(kernel=plan.kernel) for p in s.driver_apt_packages]
    copy = plan.from_wheelhouse("driver", version)
    apt.packages(  # from a wheelhouse the host may reach no mirror: its lists are not refreshed
        name=f"Install the driver's prerequisites ({', '.join(packages)})",
        packages=packages,
        update=copy is None,
        cache_time=3600,
        no_recommends=True,
    )
    runfile = f"{RUNFILE_DIR}/rebellions-x86_64-{version}.run"
    url = (s.driver_runfile_url or "").format(version=version)  # checked in check_data
    part = runfile + ".part"
    get = (
        shlex.join(["cp", copy.dest, part])
        if copy
        else command(s.serve_root, "driver.py", "fetch", url, part)
    )
    fetch = (
        f"{shlex.join(['mkdir', '-p', RUNFILE_DIR])} && {get} && "
        f"echo {shlex.quote(s.driver_sha256[version] + '  ' + part)} | sha256sum --check --strict && "
        f"{shlex.join(['mv', part, runfile])}"
    )
    server.shell(
        name=f"{'Take' if copy else 'Fetch'} the driver {version} runfile"
        f"{' from the wheelhouse' if copy else ''} and check its sha256",
        commands=[fetch],  # driver.py retries what is transient itself, never a refusal
    )
    if plan.active_units:
        server.shell(
            name="Stop this host's servers for the driver change",
            commands=[f"systemctl stop {shlex.quote(UNIT_GLOB)}"],
        )
    # A failed install shows the installer's log tail and brings back what served before.
    log = f"{RUNFILE_DIR}/install-{version}.log"
    restore = command(s.serve_root, "instances.py", "restore", plan.state_dir)
    server.shell(
        name=f"Install driver {version}",
        commands=[
            f"{shlex.join(['sh', runfile, *s.driver_installer_args])} >{shlex.quote(log)} 2>&1 || "
            f"{{ rc=$?; echo {shlex.quote(f'servefleet: driver {version} installer failed; its log ({log}) ends:')} >&2; "
            f"tail -n 25 {shlex.quote(log)} >&2; {restore} >&2; exit $rc; }}"
        ],
    )
    server.shell(
        name=f"Check that rbln-smi reports driver {version}",
        commands=[command(s.serve_root, "driver.py", "check", version)],
    )
    return server.shell(
        name="Bring back the servers of the last good state through the health gate",
        commands=[restore],
    )
