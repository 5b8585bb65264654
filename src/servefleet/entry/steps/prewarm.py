"""Pre-warm and converge: with ``serve_prewarm_scope = "host"`` each host converges and its
first cold instance compiles alone; with ``"fleet"`` one host compiles, compile only (the build
host ``serve_prewarm_host``, else the seed: the first cold host), as its own user in a network
namespace of its own, into its own cache; that cache goes to the controller's store, and every
cold host (the seed too) gets the copy and converges warm (:mod:`servefleet.entry.steps.fleet` says
who is who). A serving host's cache is never copied (#31 finding 5).

A cache that differs from its seal (``serve_verify``, #36) counts as cold: a fleet copy replaces
it where there is one; just before the converge, ``remote/warm_state.py drop`` drops it if it
still differs (its first instance stopped, its directories and marker removed), so that instance
restarts cold and compiles it again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyinfra import host, logger
from pyinfra.operations import server

from servefleet.base.remote.layout import BUILD_CACHE, BUILD_USER, PREWARM, PREWARM_COPIES
from servefleet.entry.steps import fleet, units
from servefleet.entry.steps.fleet import run_plan
from servefleet.entry.steps.lib import command
from servefleet.entry.steps.operations import prewarm_pull, prewarm_push
from servefleet.hostplan.types import NOLOGIN, HostPlan


def _copy_args(plan: HostPlan, cache_root: str | None = None) -> dict[str, Any]:
    """Where a fingerprint's cache is on the host (``cache_root``, default the servers') and in
    the controller's store."""
    s = plan.settings
    return dict(
        fingerprint=plan.spec.compile_fingerprint or "",
        cache_root=cache_root or s.serve_cache_root,
        lib=plan.lib,
        store=s.serve_prewarm_store,
        copies=f"{plan.state_dir}/{PREWARM_COPIES}",
    )


def compile_only(plan: HostPlan, when: Callable[[], bool]) -> None:
    """The build host or the seed: compile only (no NPU), as :data:`BUILD_USER`, into
    ``serve_root/build-cache``, in a network namespace of its own (``remote/prewarm.py
    build``); the store then takes that cache."""
    server.group(_if=when, name=f"Create group {BUILD_USER}", group=BUILD_USER, system=True)
    server.user(_if=when, name=f"Create system user {BUILD_USER} (compile-only builds)",
                user=BUILD_USER, group=BUILD_USER, system=True, home="/nonexistent",
                create_home=False, shell=NOLOGIN)  # fmt: skip
    desired = units.upload_desired(plan, PREWARM, "the instance to compile", when)
    sku = plan.hardware.skus[0]
    server.shell(
        _if=when,
        name=f"Compile {plan.spec.compile_fingerprint} for {sku} (compile only, no NPU)",
        commands=[command(plan.settings.serve_root, "prewarm.py", "build", desired, sku)],
    )


def drop_drifted(plan: HostPlan, when: Callable[[], bool] | None = None) -> None:
    """A cache that differed from its seal when the probe read it (``serve_verify``): dropped on
    the host if it still differs, its first instance stopped so that the converge restarts it
    cold (``remote/warm_state.py drop``)."""
    if not plan.cache_drift or plan.builder or not plan.instances:
        return
    for line in plan.cache_drift:
        logger.warning(f"{host.print_prefix}{line}")
    s, fp, first = plan.settings, plan.spec.compile_fingerprint or "", plan.restart_order[0].unit
    server.shell(
        _if=when,
        name=f"Drop the compile cache of {fp} (it differs from its seal); {first} compiles it again",
        commands=[command(s.serve_root, "warm_state.py", "drop", s.serve_cache_root, fp, first)],
    )


def converge(plan: HostPlan) -> None:
    """The instances through the health gate, pre-warmed as serve_prewarm_scope says."""
    entry = run_plan().warm[host.name]
    if not entry.fleet:
        drop_drifted(plan)
        units.converge(plan)
        return

    def role_is(*wanted: str) -> Callable[[], bool]:
        return fleet.role_is(host.name, *wanted)

    # pyinfra runs each operation on every host before the next, so the order of these lines is
    # the fleet's: the seed or build host compiles, its cache goes to the store, the others get
    # the copy, then they converge (warm). Each runs only where the host's role says, at run time.
    cold = not plan.warm
    if cold or plan.builder:
        compile_only(plan, when=role_is("build", "seed"))
    fp = plan.spec.compile_fingerprint
    if not entry.kept:
        prewarm_pull(
            _if=role_is("build", "seed"),
            name=f"Keep the compile-only cache of {fp} on the controller",
            **_copy_args(plan, f"{plan.settings.serve_root}/{BUILD_CACHE}"),
        )
    if cold and not plan.builder:
        prewarm_push(
            _if=role_is("copy", "seed"),
            name=f"Copy the fleet's compile cache of {fp} to this host",
            user=plan.settings.serve_user,
            **_copy_args(plan),
        )
    if not plan.builder:
        drop_drifted(plan, when=role_is("host", "warm", "copy", "seed"))
        units.converge(plan, when=role_is("host", "warm", "copy", "seed"))
