"""The driver, when the host's platform says it must change (``Platform.driver_needed``): the
platform plans the change (``Platform.driver_plan``, a
:class:`~servefleet.platforms.base.DriverPlan`; RBLN: its runfile) and this step turns it into operations: the apt source and packages it needs, its
installer (fetched, or from the wheelhouse, and checked against its sha256), this host's servers
stopped, the install run, the version checked, and the servers of the host's last good state
back through the health gate. A failed install shows the tail of its log and brings those
servers back too. A platform that plans no change (its driver must be there) adds nothing."""

from __future__ import annotations

import re
import shlex

from pyinfra.api.operation import OperationMeta
from pyinfra.operations import apt, files, server
from pyinfra.operations.util import any_changed

from servefleet.base.errors import ServefleetError
from servefleet.base.remote.layout import UNIT_GLOB
from servefleet.entry.steps.lib import command
from servefleet.hostplan.types import HostPlan
from servefleet.platforms.base import DriverPlan


def check_data(plan: HostPlan) -> None:
    """Before any change: the data holds what the kind needs to install the driver (RBLN: the
    runfile's URL and sha256) when the driver is needed."""
    if plan.refusal or not plan.driver_needed:
        return
    problem = plan.platform.driver_problem(plan.settings)
    if problem:
        raise ServefleetError(problem)


def install(plan: HostPlan) -> OperationMeta | None:
    """The operations of the host's driver change (none when it needs none).

    + plan: the host's plan
    """
    if not plan.driver_needed:
        return None
    change = plan.platform.driver_plan(plan.settings, plan.kernel)
    if change is None:
        return None
    _prerequisites(plan, change)
    _installer(plan, change)
    if plan.active_units:
        server.shell(
            name="Stop this host's servers for the driver change",
            commands=[f"systemctl stop {shlex.quote(UNIT_GLOB)}"],
        )
    # A failed install shows the installer's log tail and brings back what served before.
    s, version, log = plan.settings, change.version, change.log
    restore = command(s.serve_root, "instances.py", "restore", plan.state_dir)
    server.shell(
        name=f"Install driver {version}",
        commands=[
            f"{shlex.join(change.install)} >{shlex.quote(log)} 2>&1 || "
            f"{{ rc=$?; echo {shlex.quote(f'servefleet: driver {version} installer failed; its log ({log}) ends:')} >&2; "
            f"tail -n 25 {shlex.quote(log)} >&2; {restore} >&2; exit $rc; }}"
        ],
    )
    argv, key = change.check
    server.shell(
        name=f"Check that {argv[0]} reports driver {version}",
        commands=[command(s.serve_root, "driver.py", "check", version, key, *argv)],
    )
    return server.shell(
        name="Bring back the servers of the last good state through the health gate",
        commands=[restore],
    )


def _prerequisites(plan: HostPlan, change: DriverPlan) -> None:
    """The apt source (its key too) and the packages the driver needs."""
    if change.apt_repo:
        repo = change.apt_repo
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
    if change.apt_packages is not None:
        copy = plan.from_wheelhouse("driver", change.version)
        apt.packages(  # from a wheelhouse the host may reach no mirror: its lists are not refreshed
            name=f"Install the driver's prerequisites ({', '.join(change.apt_packages)})",
            packages=list(change.apt_packages),
            update=copy is None,
            cache_time=3600,
            no_recommends=True,
        )


def _installer(plan: HostPlan, change: DriverPlan) -> None:
    """The installer into its place, fetched or from the wheelhouse, checked against its sha256
    (a partial file never takes its name)."""
    file = change.installer
    if file is None:
        return
    s, version = plan.settings, change.version
    copy = plan.from_wheelhouse("driver", version)
    part = file.dest + ".part"
    get = (
        shlex.join(["cp", copy.dest, part])
        if copy
        else command(s.serve_root, "driver.py", "fetch", file.url, part)
    )
    fetch = (
        f"{shlex.join(['mkdir', '-p', file.dest.rsplit('/', 1)[0]])} && {get} && "
        f"echo {shlex.quote(file.sha256 + '  ' + part)} | sha256sum --check --strict && "
        f"{shlex.join(['mv', part, file.dest])}"
    )
    server.shell(
        name=f"{'Take' if copy else 'Fetch'} the driver {version} {file.what}"
        f"{' from the wheelhouse' if copy else ''} and check its sha256",
        commands=[fetch],  # driver.py retries what is transient itself, never a refusal
    )
