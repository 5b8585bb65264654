"""Controller-side resolution and builds for a host's release: hosts never build, so the wheel
of a package the indexes hold only as an sdist is built here, once per Python version, and
uploaded with the release (``servefleet.release.builds``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pyinfra import host, logger

from servefleet.base.errors import ServefleetError
from servefleet.base.once import once
from servefleet.hostplan.types import HostPlan
from servefleet.release.builds import build, sdist_only
from servefleet.release.owners import changed_on_index
from servefleet.release.resolve import resolve
from servefleet.release.stack import LockError, Stack


@once
def resolved(st: Stack, user: str | None, password: str | None) -> str:
    """The stack resolved on the controller (a pylock), once a run for every host (hosts are
    planned at the same time: the others wait for the first, never resolve it again)."""
    return resolve(st, user, password)


def with_built_wheels(plan: HostPlan) -> HostPlan:
    """The plan with the wheels of its release's sdist-only packages, built once on the
    controller (the host installs them and never compiles). Only when the release is to be
    installed: unlocked, the controller resolves the stack to learn which packages those are."""
    rel, s = plan.release, plan.settings
    if plan.release_complete or plan.refusal or rel.stack is None:
        return plan
    if rel.pylock:
        pylock = rel.pylock
    else:
        try:
            pylock = resolved(rel.stack, s.index_user, s.index_password)
        except LockError as e:  # the host may reach indexes the controller does not
            logger.warning(f"{host.print_prefix}cannot resolve release {rel.id} on the "
                           f"controller ({e}); a package with only an sdist will fail the "
                           "host's install (hosts never build)")  # fmt: skip
            return plan
    sdists = sdist_only(pylock)
    if not sdists:
        return plan
    if not plan.python:
        raise ServefleetError(f"sdk_python: {s.sdk_python} does not run on the host")
    built = []
    for package in sdists:
        wheel = build(package, plan.python, rel.stack, Path(s.sdk_wheel_cache), s.index_user,
                      s.index_password)  # fmt: skip
        how = (
            "built on the controller"
            if wheel.fresh
            else "built before, from the controller's cache"
        )
        logger.info(f"{host.print_prefix}{wheel.name}=={wheel.version} for Python {plan.python}: "
                    f"{wheel.path.name} ({how})")  # fmt: skip
        built.append(wheel.to_json(f"{plan.lib}/wheels"))
    return dataclasses.replace(plan, release=dataclasses.replace(rel, built=tuple(built)))


def changed_on_the_index(plan: HostPlan) -> dict[str, Any]:
    """Unlocked and serving its release: what the indexes now serve under the same versions but
    with other bytes than the release was installed with (resolved on the controller)."""
    rel, s = plan.release, plan.settings
    if rel.locked or rel.stack is None or plan.current != rel.id or not plan.current_files:
        return {}
    try:
        return changed_on_index(
            plan.current_files, resolved(rel.stack, s.index_user, s.index_password)
        )
    except LockError as e:
        logger.warning(f"{host.print_prefix}plan: cannot compare with the indexes: {e}")
        return {}
