"""The fleet plan of one pyinfra run (:mod:`servefleet.fleet.fleetplan`), made from pyinfra's
inventory on first use: every host's name, address, groups and (when the plan needs it) data.

Deploy code runs for every host before any operation runs, so each host takes its place from it
while it is planned, and joins its plan; operations that decide when they run (the fleet
router's workers, the decodes' re-check, a fleet pre-warm's roles) read the joined plans then.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pyinfra import host

from servefleet.entry.steps.lib import per_run
from servefleet.fleet.fleetplan import FleetHost, FleetPlan, fleet_of
from servefleet.settings.table import Settings, settings_from


def address_of(h: Any) -> str:
    """How the inventory reaches a host (its ``ssh_hostname``, else its name)."""
    return str(h.data.get("ssh_hostname") or h.name)


def _settings_of(h: Any) -> Settings:
    return settings_from(h.data.get, keys=h.data.dict().keys())


def _serving_group(h: Any) -> str | None:
    group = h.data.get("serve_group")
    return group if isinstance(group, str) else None  # else its own check names it


def _of_inventory(state: Any) -> FleetPlan:
    return fleet_of(
        [
            FleetHost(
                h.name,
                address_of(h),
                tuple(h.groups),
                functools.partial(_settings_of, h),
                _serving_group(h),
                state.is_host_in_limit(h),
            )  # fmt: skip
            for h in state.inventory
        ]
    )


def run_plan(state: Any | None = None) -> FleetPlan:
    """The fleet plan of the run ``state`` (pyinfra's State; default this host's run)."""
    return per_run(state or host.state, FleetPlan, _of_inventory)


def role_is(name: str, *wanted: str) -> Callable[[], bool]:
    """An ``_if`` for host ``name``: true when, at run time, its fleet pre-warm role is one of
    ``wanted``."""
    run = run_plan()
    return lambda: run.prewarm_role(name) in wanted
