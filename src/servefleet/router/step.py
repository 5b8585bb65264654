"""The router: its own system user and release (a venv of ``vllm-router``, hash-locked like the
stack) in ``releases/<id>``, on a host with ``serve_router = "host"`` (its unit is written,
restarted through its gate and kept in step with the instances by the host's converge,
``remote/instances.py``) or on each host of ``serve_router_group`` with ``"fleet"``: there the
router is all the host runs, over every instance of the run's other hosts, which each serving
host joins while it is planned (the run's fleet plan: :mod:`servefleet.entry.steps.fleet`); its
unit is made when it runs, once every host is known."""

from __future__ import annotations

import json
from typing import Any

from pyinfra import host
from pyinfra.api import FunctionCommand, operation
from pyinfra.operations import apt, server

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import (
    PLANS,
    PROXY_CONF,
    PROXY_UNIT,
    ROUTER_ADMIN_MAP,
    SECRETS_DIR,
    UNIT_DIR,
)
from servefleet.entry.steps import ensure
from servefleet.entry.steps.fleet import run_plan
from servefleet.entry.steps.lib import command
from servefleet.entry.steps.operations import release, run_with_doc
from servefleet.hostplan.types import NOLOGIN, HostPlan
from servefleet.router.plan import RouterPlan
from servefleet.settings.check_words import API_KEY_ALLOWED

NO_HOME = "/nonexistent"  # the router user's home: it keeps nothing


def check_data(plan: HostPlan) -> None:
    """What a deploy needs besides valid data: with ``serve_router = "fleet"``, the routers'
    admin key (DataError, one line)."""
    s = plan.settings
    if s.router_fleet and not s.router_admin_key:
        raise DataError(
            f"creds_router_admin_key_env: serve_router is fleet, and ${s.creds_router_admin_key_env}"
            " is not set: the fleet's hosts reach the routers' worker API with it; allowed: a "
            f"key of {API_KEY_ALLOWED}"
        )


def proxy(plan: HostPlan) -> None:
    """The router's proxy (nginx, and nftables for the router's guard, installed from the host's
    Debian mirror when missing): its configuration, unit and (``serve_router = "fleet"``) admin
    key written where they differ; restarted when it runs another unit text, else reloaded
    (gracefully: what it has in flight finishes) when it runs another configuration or key. What
    it runs is read from its runtime copies, so a run that died after a write restarts or reloads
    it the next time."""
    r = plan.router
    assert r is not None and r.proxy is not None
    p = r.proxy
    missing = [pkg for pkg, have in (("nginx", p.nginx), ("nftables", p.nft)) if not have]
    if missing:
        apt.packages(name="Install nginx (the router's proxy) and nftables (its guard)",
                     packages=missing, update=True, cache_time=3600, no_recommends=True)  # fmt: skip
    if not p.nginx:  # Debian starts its own nginx.service, its default site on every address's
        # port 80 (#46: what a host exposes); the proxy is a unit of its own. An nginx that was
        # on the host before is the operator's, and left as it is.
        server.shell(name="Stop and disable Debian's nginx.service (the proxy is its own unit)",
                     commands=["systemctl disable --now --quiet nginx.service"])  # fmt: skip
    conf_new = ensure.upload(plan, "Write the router proxy's configuration", p.conf.encode(),
                             PROXY_CONF)  # fmt: skip
    unit_new = ensure.upload(plan, f"Write {PROXY_UNIT}", p.unit_text.encode(),
                             f"{UNIT_DIR}/{PROXY_UNIT}")  # fmt: skip
    key_new = False
    if p.admin_map is not None:
        ensure.directory(plan, SECRETS_DIR, mode="700")
        key_new = ensure.secret(plan, "Write the routers' admin key (0600)", ROUTER_ADMIN_MAP,
                                p.admin_map)  # fmt: skip
    if unit_new or not p.running:
        server.shell(name=f"(Re)start {PROXY_UNIT}", commands=[
            "systemctl daemon-reload", f"systemctl enable --quiet {PROXY_UNIT}",
            f"systemctl restart {PROXY_UNIT}"])  # fmt: skip
    elif conf_new or key_new or not p.loaded:
        server.shell(name=f"Reload {PROXY_UNIT}", commands=[f"systemctl reload {PROXY_UNIT}"])


def install(plan: HostPlan) -> None:
    """The router's user and release (none when it runs already from a complete release), then
    its proxy."""
    r, s = plan.router, plan.settings
    if r is None:
        return
    if not (r.release_complete and r.active == "active"):
        user = s.serve_router_user
        server.group(name=f"Create group {user}", group=user, system=True)
        server.user(name=f"Create system user {user} (the router's)", user=user, group=user,
                    system=True, home=NO_HOME, create_home=False, shell=NOLOGIN)  # fmt: skip
        plan_file = f"{s.serve_root}/{PLANS}/{r.release.id}.json"
        plan_json = json.dumps(r.release.to_json(), indent=1, sort_keys=True) + "\n"
        ensure.upload(plan, f"Upload the plan of router release {r.release.id}",
                      plan_json.encode(), plan_file)  # fmt: skip
        if not r.release_complete:
            release(
                name=f"Install router release {r.release.id} (vllm-router "
                f"{s.serve_router_version})",
                plan_file=plan_file,
                marker=r.release.marker,
                installer=f"{plan.lib}/install_release.py",
            )
    proxy(plan)


def _converge_fleet_router(state: Any, host: Any, plan: HostPlan) -> bool:  # noqa: F811
    """Run time: the router over every instance the run's hosts joined, unless it runs so
    (pyinfra passes ``state`` and ``host`` by these names)."""
    assert plan.router is not None
    s = plan.settings
    run = run_plan(state)
    router: RouterPlan = plan.router.over(s, *run.fleet_workers())
    all_healthy = router.healthy is not None and all(router.healthy.get(w) for w in router.workers)
    if router.converged and all_healthy and not run.changing():
        return True  # it runs this list, finds every instance healthy, and none restarts now
    doc = {
        "router": router.to_json(),
        "model": plan.desired_state()["model"],
        "host": s.serve_host,
        "health_timeout": s.serve_health_timeout,
        "keyless": bool(s.api_key),  # the servers' key stays with them
    }
    cmd = command(s.serve_root, "instances.py", "router", "-")
    return run_with_doc(host, cmd, doc, "the fleet router failed")


@operation(is_idempotent=False)
def fleet_router(plan: HostPlan):
    """
    The fleet router of this host over every instance of the run's other hosts, through its
    gate; its worker list is made when this runs (every host is planned by then).

    + plan: this router host's plan
    """
    yield FunctionCommand(_converge_fleet_router, (plan,), {})


def converge_fleet_router(plan: HostPlan) -> None:
    fleet_router(name="Converge the fleet router over every instance of the run", plan=plan)


@operation()
def _fleet_servers_done():
    """
    Nothing to do: an ordering point. pyinfra orders one run's operations by each host's own
    sequence, and an operation added from one line of code on several hosts is one step, so
    a router host's fleet router (after this) runs after every serving host's servers (before
    this) converged.
    """
    host.noop("every host's servers have converged")
    return
    yield  # an operation with no command


def after_servers() -> None:
    """With ``serve_router = "fleet"``, on every host: the point after the servers' steps."""
    _fleet_servers_done(name="The fleet's servers are converged (the fleet router comes next)")


def _recheck_decodes(state: Any, host: Any, plan: HostPlan) -> bool:  # noqa: F811
    """Run time: when a host of this run restarts servers, this host's decodes take one
    request from each prefill of the run (``instances.py peers``)."""
    run = run_plan(state)
    if not run.changing():
        return True  # no server of the run restarts: the pools are as they were checked
    doc = {**plan.desired_state(), "prefills": run.prefills()}
    cmd = command(plan.settings.serve_root, "instances.py", "peers", plan.state_dir, "-")
    return run_with_doc(host, cmd, doc, "the prefill/decode re-check failed")


@operation(is_idempotent=False)
def recheck_decodes(plan: HostPlan):
    """
    This decode host's decodes re-checked against every prefill of the run, after the run's
    servers converged (a decode that cannot read from a restarted prefill restarts).

    + plan: this host's plan
    """
    yield FunctionCommand(_recheck_decodes, (plan,), {})


def recheck(plan: HostPlan) -> None:
    """With ``serve_router = "fleet"``, on a host serving decodes: after :func:`after_servers`."""
    if any(i.role == "decode" for i in plan.instances):
        recheck_decodes(name="Re-check this host's decodes against the run's prefills", plan=plan)
