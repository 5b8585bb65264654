"""``servefleet plan`` / ``status``: this host's summary from the deploy's own plan, written on
the controller where the CLI asked (:class:`servefleet.fleetview.ReportRequest`). Adds no
operation: changes nothing."""

from __future__ import annotations

import json

from pyinfra import host

from servefleet.fleetview import ReportRequest, plan_summary, status_summary
from servefleet.hostplan import HostPlan
from servefleet.steps.facts import InstanceHealth, PreflightRefusal
from servefleet.steps.fleet import warm_entry
from servefleet.steps.plan import host_plan
from servefleet.steps.wheels import changed_on_the_index


def preflight_refusal(plan: HostPlan) -> str | None:
    """The deploy's pre-flight, run now when the release is on the host already."""
    if not (plan.release_complete and plan.preflight_needed):
        return None
    s = plan.settings
    return host.get_fact(
        PreflightRefusal,
        user=s.serve_user,
        python=f"{plan.release.path}/bin/python",
        script=f"{plan.lib}/preflight.py",
        instances=json.dumps(plan.preflight_input, sort_keys=True),
    )


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
        refusal = preflight_refusal(plan)
        if refusal:  # what the deploy's pre-flight would stop this host with
            summary.update(refusal=refusal, changes=False)
    request.write(host.name, summary)
