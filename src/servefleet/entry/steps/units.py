"""Units: the desired state of the host's instances (unit texts included) uploaded, and one
converge by ``remote/instances.py``: unit files written, each instance restarted in order
through the health gate; a failed gate rolls the host back to its last good state. Also the
rollback to a kept state."""

from __future__ import annotations

import json
from collections.abc import Callable
from io import StringIO

from pyinfra.operations import files, server

from servefleet.base.remote.layout import DESIRED, STATE
from servefleet.entry.steps.lib import command
from servefleet.hostplan.types import HostPlan
from servefleet.settings.table import Settings


def upload_desired(
    plan: HostPlan, filename: str, what: str, when: Callable[[], bool] | None
) -> str:
    """Upload the host's desired state (unit texts included) to ``state/<filename>``."""
    dest = f"{plan.state_dir}/{filename}"
    files.put(
        _if=when,
        name=f"Upload {what}",
        src=StringIO(json.dumps(plan.desired_state(), indent=1, sort_keys=True) + "\n"),
        dest=dest,
        mode="644",
    )
    return dest


def converge(plan: HostPlan, when: Callable[[], bool] | None = None) -> None:
    """One converge of the unit files and the running instances, unless every instance already
    runs its unit (judged from the processes in the probe, never from what a run wrote).

    + when: run only if this is true at run time (fleet pre-warm: the seed converges first)
    """
    if plan.converged:
        return
    desired = upload_desired(plan, DESIRED, "the desired state of this host's instances", when)
    pending = [i for i in plan.instances if not (i.converged and i.written)]
    word = plan.platform.device_word
    what = [f"{i.unit} (port {i.port}, {word} {i.devices})" for i in pending]
    what += [f"remove {u}" for u in plan.stale_units]
    server.shell(
        _if=when,
        name=f"Converge the instances through the health gate: {', '.join(what) or 'pre-warm'}",
        commands=[command(plan.settings.serve_root, "instances.py", "converge", desired)],
    )


def roll_back(settings: Settings, to: str = "previous") -> None:
    """Back to a kept state through the health gate: ``previous`` (the state before the last
    good one) or ``good`` (the last good one)."""
    state = f"{settings.serve_root}/{STATE}"
    server.shell(
        name=f"Roll back to the {to} state",
        commands=[
            command(
                settings.serve_root,
                "instances.py",
                "rollback" if to == "previous" else "restore",
                state,
            )
        ],
    )
