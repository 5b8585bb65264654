"""``servefleet plan`` / ``status``: this host's summary from the deploy's own plan, written on
the controller where the CLI asked (:class:`servefleet.fleet.fleetview.ReportRequest`). Adds no
operation: changes nothing. A host whose plan fails (probe output it cannot read, a bug) is
reported as refused with that one line, so ``plan`` shows it and ``status`` names it; so is one
whose health check (``remote/health.py``, for ``status``) gives no answer or one it cannot read."""

from __future__ import annotations

import json
from typing import Any

from pyinfra import host

from servefleet.base.errors import ProbeError
from servefleet.entry.steps.facts import InstanceHealth, PreflightRefusal, preflight_command
from servefleet.entry.steps.plan import plan_or_failure
from servefleet.entry.steps.wheels import changed_on_the_index
from servefleet.fleet.fleetplan import warm_entry
from servefleet.fleet.fleetview import ReportRequest, plan_summary
from servefleet.fleet.statusview import status_summary
from servefleet.hostplan.types import HostPlan


def preflight_refusal(plan: HostPlan) -> str | None:
    """The deploy's pre-flight, run now when the release is on the host already."""
    if not (plan.release_complete and plan.preflight_needed):
        return None
    instances = json.dumps(plan.preflight_input, sort_keys=True)
    return host.get_fact(PreflightRefusal, run=preflight_command(plan, instances))


def instance_health(checks: dict[str, Any]) -> dict[str, str] | str:
    """The deploy's health gate for each instance of ``checks``, run on the host: port -> "ok"
    or why not; or, in one line, why there is no answer (output the fact cannot read, or none:
    the command failed, pyinfra has shown its output, or it printed nothing).

    + checks: the model, the address, and the instances (``remote/health.py status``)
    """
    if not (checks["instances"] or checks["headless"]):
        return {}
    try:
        health = host.get_fact(InstanceHealth, checks=json.dumps(checks, sort_keys=True))
    except ProbeError as e:
        return str(e)
    if health is None:
        return "instance health: no answer (remote/health.py failed or printed nothing)"
    return health


def _failed(kind: str | None, why: str, address: str, order: int) -> dict[str, Any]:
    """The summary of a host without a plan: refused with why, nothing known of it."""
    if kind == "status":
        unknown_now = ("driver", "sku", "devices", "release", "good_release", "warm", "fingerprint",
                       "router", "group")  # fmt: skip
        return {
            **dict.fromkeys(unknown_now),
            "address": address,
            "refusal": why,
            "release_drift": [],
            "verified": {},
            "packages": {},
            "instances": [],
            "stale_units": [],
        }
    unknown = ("driver", "release", "install_release", "locked", "warm_entry", "fingerprint")
    return {
        **dict.fromkeys(unknown),
        "refusal": why,
        "changed_on_index": {},
        "release_drift": [],
        "packages": {},
        "models": [],
        "restarts": [],
        "remove": [],
        "recompile": False,
        "prewarm": "host",
        "order": order,
        "changes": False,
    }


def report() -> None:
    request = ReportRequest.from_env()
    plan = plan_or_failure(files=request.kind == "plan")
    address = str(host.data.get("ssh_hostname") or host.name)
    order = [h.name for h in host.state.inventory].index(host.name)
    if isinstance(plan, str):
        request.write(host.name, _failed(request.kind, plan, address, order))
        return
    if request.kind == "status":
        desired = plan.desired_state()  # the model and address the deploy's gate checks
        checks = {
            "model": desired["model"],
            "host": desired["host"],
            "instances": [[i.unit, i.port] for i in plan.instances if i.serves],
            "headless": [[i.unit, i.port] for i in plan.instances if not i.serves],
        }
        if plan.router:  # its gate: a chat through it, with a server's key when it has one
            key_unit = plan.instances[0].unit if plan.instances else ""
            checks["instances"].append([plan.router.unit, plan.router.port, key_unit, True])
        health = instance_health(checks)
        if isinstance(health, str):  # no health known: the host is refused with why
            request.write(host.name, _failed(request.kind, health, address, order))
            return
        summary = status_summary(plan, health, address)
    else:
        summary = plan_summary(plan, warm_entry(host.name, plan), order, changed_on_the_index(plan))
        refusal = preflight_refusal(plan)
        if refusal:  # what the deploy's pre-flight would stop this host with
            summary.update(refusal=refusal, changes=False)
    request.write(host.name, summary)
