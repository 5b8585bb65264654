"""The router (``serve_router = "host"``): its own system user, and its own release (a venv of
``vllm-router``, hash-locked like the stack) installed into ``releases/<id>``. Its unit is
written, restarted through its gate and kept in step with the instances by the host's
converge (``remote/instances.py``), with the instances, in one run."""

from __future__ import annotations

import json

from pyinfra.operations import server

from servefleet.hostplan import NOLOGIN, HostPlan
from servefleet.remote.layout import PLANS
from servefleet.steps import ensure
from servefleet.steps.operations import release

NO_HOME = "/nonexistent"  # the router user's home: it keeps nothing


def install(plan: HostPlan) -> None:
    """The router's user and release, unless the router runs converged already."""
    r, s = plan.router, plan.settings
    if r is None or r.converged:
        return
    user = s.serve_router_user
    server.group(name=f"Create group {user}", group=user, system=True)
    server.user(name=f"Create system user {user} (the router's)", user=user, group=user,
                system=True, home=NO_HOME, create_home=False, shell=NOLOGIN)  # fmt: skip
    plan_file = f"{s.serve_root}/{PLANS}/{r.release.id}.json"
    plan_json = json.dumps(r.release.to_json(), indent=1, sort_keys=True) + "\n"
    ensure.upload(plan, f"Upload the plan of router release {r.release.id}", plan_json.encode(),
                  plan_file)  # fmt: skip
    if not r.release_complete:
        release(
            name=f"Install router release {r.release.id} (vllm-router {s.serve_router_version})",
            plan_file=plan_file,
            marker=r.release.marker,
            installer=f"{plan.lib}/install_release.py",
        )
