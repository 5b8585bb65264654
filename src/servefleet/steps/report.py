"""``servefleet plan`` / ``status``: this host's summary from the deploy's own plan, written on
the controller where the CLI asked (:class:`servefleet.fleetview.ReportRequest`). Adds no
operation: changes nothing."""

from __future__ import annotations

import json

from pyinfra import host

from servefleet.fleetview import ReportRequest, plan_summary, status_summary
from servefleet.steps.facts import InstanceHealth
from servefleet.steps.fleet import warm_entry
from servefleet.steps.plan import host_plan
from servefleet.steps.wheels import changed_on_the_index


def report() -> None:
    request = ReportRequest.from_env()
    plan = host_plan(files=request.kind == "plan")
    if request.kind == "status":
        desired = plan.desired_state()  # the model and address the deploy's gate checks
        checks = {
            "model": desired["model"],
            "host": desired["host"],
            "instances": [[i.unit, i.port] for i in plan.instances],
        }
        health = (
            host.get_fact(InstanceHealth, checks=json.dumps(checks, sort_keys=True))
            if plan.instances
            else {}
        )
        address = str(host.data.get("ssh_hostname") or host.name)
        summary = status_summary(plan, health, address)
    else:
        order = [h.name for h in host.state.inventory].index(host.name)
        summary = plan_summary(plan, warm_entry(plan), order, changed_on_the_index(plan))
    request.write(host.name, summary)
