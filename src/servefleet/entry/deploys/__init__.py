"""The deploys: each a ``@deploy`` that composes the steps (:mod:`servefleet.entry.steps`) for one
host's plan. The top-level ``deploys/*.py`` files call these.

All decisions are made in :func:`host_plan` (pure core + one probe of the host), before any
operation is added: bad data stops the whole run there with one line, and no host changes; a
host whose plan fails otherwise (probe output it cannot read, a bug) has no plan (None) and
fails alone, in one line.
On a host, every failure is a failing command (never a Python exception inside an operation),
so it fails that host alone.

Order on each host: SKU check -> driver -> release -> models -> pre-flight -> units -> restarts through the
health gate, one instance at a time, the first alone (it compiles) when the cache is cold.
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta

from servefleet.entry.steps import (
    credentials,
    driver as driver_step,
    group as group_step,
    lib,
    models as models_step,
    preflight,
    prewarm,
    pyinfra_cost,
    release,
    units,
    wheelhouse,
)
from servefleet.entry.steps.errors import refused
from servefleet.entry.steps.plan import host_plan, host_settings
from servefleet.entry.steps.report import report
from servefleet.hostplan.types import HostPlan
from servefleet.router import step as router_step
from servefleet.settings.table import Settings

pyinfra_cost.install()  # the same operation order, without reading source for each operation

__all__ = ["driver", "host_plan", "host_settings", "report", "models", "rollback", "serve", "stack"]


@deploy("Driver")
def driver(plan: HostPlan | None) -> OperationMeta | None:
    """Check the host's SKU, then install the wanted RBLN driver if it is missing or different;
    the servers of the host's last good state come back through the health gate."""
    if plan is None or refused(plan):
        return None
    lib.upload(plan)
    wheelhouse.copy(plan, ["driver"])
    return driver_step.install(plan)


@deploy("Release")
def stack(plan: HostPlan | None) -> OperationMeta | None:
    """Check the host's SKU, then install the pinned release the selection needs. Running
    servers keep their release: units name it, and no release a unit or state names is removed."""
    if plan is None or refused(plan):
        return None
    lib.upload(plan)
    credentials.secrets_dir(plan)
    wheelhouse.copy(plan, ["release"])
    return release.install(plan)


@deploy("Models")
def models(plan: HostPlan | None) -> None:
    """Fetch the model and any draft model into $HF_HOME/hub."""
    if plan is not None and not refused(plan):
        lib.upload(plan)
        credentials.secrets_dir(plan)
        wheelhouse.copy(plan, ["models"])
        models_step.fetch(plan)


@deploy("servefleet")
def serve(plan: HostPlan | None) -> None:
    """Fresh host to warm, health-checked vllm serve instances; a re-run changes nothing. A
    router host (``serve_router = "fleet"``) gets its router only, after every host's servers
    (:func:`servefleet.router.step.after_servers`)."""
    if plan is None or refused(plan):
        return
    lib.upload(plan)
    if plan.router_host:
        router_step.install(plan)
    else:
        credentials.secrets_dir(plan)
        wheelhouse.copy(plan, ["driver", "release", "models"])
        driver_step.install(plan)
        release.install(plan)
        router_step.install(plan)
        models_step.fetch(plan)
        preflight.check(plan)
        credentials.api_key(plan)
        credentials.router_admin_key(plan)
        if plan.group:  # a rank of a serving group: the group restarts as one
            group_step.converge(plan)
        else:
            prewarm.converge(plan)
    if plan.settings.router_fleet:  # one step of every host's: the order point
        router_step.after_servers()
    if plan.router_host:
        router_step.converge_fleet_router(plan)
    elif plan.settings.router_fleet:
        router_step.recheck(plan)


@deploy("Rollback")
def rollback(settings: Settings, to: str = "previous") -> None:
    """Back to a kept state through the health gate: ``previous`` (the state before the last
    good one) or ``good`` (the last good one, e.g. after a failed change). Needs no recipe:
    everything comes from the host's kept states.

    + to: "previous" or "good"
    """
    units.roll_back(settings, to)
