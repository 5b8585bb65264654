"""Pre-warm and converge: with ``serve_prewarm_scope = "host"`` each host converges and its
first cold instance compiles alone; with ``"fleet"`` one host compiles (the seed, or the build
host ``serve_prewarm_host``, compile only), its cache goes to the controller's store, the others
get the copy and converge warm (:mod:`servefleet.steps.fleet` says who is who)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyinfra import host
from pyinfra.operations import server

from servefleet.hostplan import HostPlan
from servefleet.remote.layout import PREWARM, PREWARM_COPIES
from servefleet.steps import units
from servefleet.steps.fleet import FleetPrewarm, warm_entry
from servefleet.steps.lib import command
from servefleet.steps.operations import prewarm_pull, prewarm_push


def _copy_args(plan: HostPlan) -> dict[str, Any]:
    """Where a fingerprint's cache is on the host and in the controller's store."""
    s = plan.settings
    return dict(
        fingerprint=plan.spec.compile_fingerprint or "",
        cache_root=s.serve_cache_root,
        lib=plan.lib,
        store=s.serve_prewarm_store,
        copies=f"{plan.state_dir}/{PREWARM_COPIES}",
    )


def compile_only(plan: HostPlan, when: Callable[[], bool]) -> None:
    """The build host: compile only (no NPU), then hand the cache to the store."""
    if plan.warm:
        return
    desired = units.upload_desired(plan, PREWARM, "the instance to compile", when)
    sku = plan.hardware.skus[0]
    server.shell(
        _if=when,
        name=f"Compile {plan.spec.compile_fingerprint} for {sku} (compile only, no NPU)",
        commands=[command(plan.settings.serve_root, "prewarm.py", "build", desired, sku)],
    )


def converge(plan: HostPlan) -> None:
    """The instances through the health gate, pre-warmed as serve_prewarm_scope says."""
    entry = warm_entry(plan)
    if not entry.fleet:
        units.converge(plan)
        return
    run = FleetPrewarm.of_run(host.state)
    run.join(entry)

    def role_is(*wanted: str) -> Callable[[], bool]:
        return run.role_is(host.name, *wanted)

    # pyinfra runs each operation on every host before the next, so the order of these lines is
    # the fleet's: the seed or build host compiles, its cache goes to the store, the others get
    # the copy, then they converge (warm). Each runs only where the host's role says, at run time.
    if not plan.warm:
        units.converge(plan, when=role_is("seed"))
        if plan.builder:
            compile_only(plan, when=role_is("build"))
    fp = plan.spec.compile_fingerprint
    if not entry.kept:
        prewarm_pull(
            _if=role_is("seed", "source", "build"),
            name=f"Keep the compile cache of {fp} on the controller",
            **_copy_args(plan),
        )
    if not plan.warm and not plan.builder:
        prewarm_push(
            _if=role_is("copy"),
            name=f"Copy the fleet's compile cache of {fp} to this host",
            user=plan.settings.serve_user,
            **_copy_args(plan),
        )
    if not plan.builder:
        units.converge(plan, when=role_is("host", "warm", "source", "copy"))
