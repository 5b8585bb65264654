"""What one host needs, computed from its data, its recipe and one probe of its state.

Pure (no pyinfra import): the deploys turn a HostPlan into operations. Everything a host's
operations depend on is decided here, once, before any operation is added.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from servefleet.base.errors import DataError, RecipeError
from servefleet.base.remote.layout import NETRC, unit_name
from servefleet.hostplan.extras import resolve_for
from servefleet.hostplan.instance_unit import HEADLESS, instance_unit
from servefleet.hostplan.placement import place_pd
from servefleet.hostplan.ranks import guard_commands, no_group, place_rank
from servefleet.hostplan.types import NOLOGIN, HostPlan, Instance, Place
from servefleet.kinds import Hardware, kind_of, platform_of
from servefleet.kinds.roles import is_pd, rendezvous_ports
from servefleet.release.glibc import glibc_refusal, host_glibc
from servefleet.release.lock import load_lock
from servefleet.release.plan import plan_release, plan_router_release, unlocked
from servefleet.release.wheelhouse import Copy, host_copies
from servefleet.router.plan import host_router, plan_router, worker_url
from servefleet.settings.across import unread_key
from servefleet.settings.checks import MAX_PORT
from servefleet.settings.table import Settings
from servefleet.spec import Server, ServeSpec

_KERNEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~_-]{0,127}")  # `uname -r`, as apt names take it
ALONE = Place()  # a host planned on its own: no fleet around it
LOGIN_SHELLS_EXCLUDED = (NOLOGIN, "/sbin/nologin", "/bin/false", "/usr/bin/false")


def _version_word(value: Any) -> str | None:
    """A version string from a host's state, or None for anything else (odd probe output)."""
    if isinstance(value, str) and re.fullmatch(r"[0-9A-Za-z.+!_-]{1,64}", value):
        return value
    return None


def plan_host(
    settings: Settings,
    probe: dict[str, Any],
    spec: ServeSpec | None = None,
    place: Place = ALONE,
    secret_key: bytes = b"",
) -> HostPlan:
    """Everything one host needs, from its validated data, its place in the fleet and its probe.

    + settings: the host's validated data
    + probe: the output of the probe (``remote/probe.py``) on the host
    + spec: ``resolve_for(settings)``, when the caller has it already
    + place: where the host stands in the fleet (the fleet plan's; default: a host alone)
    + secret_key: the key the probe was given for the secrets' digests (``probe_args(keyed)``)
    """
    builder, router_host, address = place.builder, place.router_host, place.address
    family = kind_of(settings.serve_recipe)  # the recipe's; the platform is the hardware's
    spec = spec or resolve_for(settings)
    platform, hardware = platform_of(family, probe)
    unread = unread_key(settings.given, family, [platform])
    if unread:  # before any change: a key of another platform than the one the probe found
        raise DataError(unread)
    refusal = None
    if builder:
        if not platform.compiles:
            raise DataError(
                f"serve_prewarm_host: {platform.name} hosts do not compile; allowed: unset"
            )
        sku = spec.skus[0]
        spec = resolve_for(settings, sku)
        npus = spec.servers[0].npus
        hardware = Hardware(
            "compile only", (sku,) * npus, tuple(range(npus)), settings.driver_version
        )
    elif not router_host:
        refusal = family.refusal(settings, spec, hardware)
        if refusal is None:
            try:
                spec = resolve_for(settings, hardware.sku)
            except RecipeError as e:  # pragma: no cover - the model was checked above
                refusal = str(e)
    glibc = host_glibc(probe.get("libc"))
    release = plan_release(unlocked(settings), spec, NETRC, glibc)
    # before any change: an owned package no source has a wheel for on this host's glibc
    owned = {d.name: d.version for d in release.downloads}
    no_wheel = None if refusal or router_host else glibc_refusal(settings.pip_indexes, owned, glibc)
    refusal = refusal or no_wheel
    if settings.sdk_lock and not no_wheel:  # a lock holds no stack that no host installs
        release = plan_release(settings, spec, NETRC, glibc)
    kernel = str(probe.get("kernel", ""))
    driver_needed = not (builder or router_host) and platform.driver_needed(settings, hardware)
    if refusal is None and driver_needed and not _KERNEL.fullmatch(kernel):
        refusal = (
            f"the host's kernel release {kernel!r} cannot name its headers package "
            "(driver_apt_packages); allowed: letters, digits and . + ~ _ -"
        )
    units: dict[str, dict[str, Any]] = probe.get("units", {})
    if builder and units:
        refusal = (
            f"serve_prewarm_host: this host has servers of ours ({', '.join(sorted(units))}); "
            "allowed: a host that serves nothing (remove them, or name another build host)"
        )
    account = probe.get("user")
    if settings.serve_user == "root" or (account and account.get("uid") == 0):
        raise DataError(f"serve_user: {settings.serve_user!r} is root; allowed: a system user")
    if account and account.get("shell") not in LOGIN_SHELLS_EXCLUDED:
        raise DataError(
            f"serve_user: {settings.serve_user!r} is an existing login user (shell {account.get('shell')}); "
            "allowed: a system user servefleet creates (no login shell)"
        )
    groups = [] if router_host else platform.groups(settings, spec, hardware)
    fleet = settings.router_fleet
    routed = settings.router_per_host or (fleet and bool(place.fleet_routers))
    placed: list[tuple[Server | None, str]] = [(None, "main")] * len(groups)
    group = place.group
    if spec.nodes > 1 and group is None and not router_host:
        raise no_group(settings, spec)
    if group is not None:  # one rank of the group's spec, on one device group
        spec, ranked, rank_refusal = place_rank(settings, spec, group, probe, address)
        refusal = refusal or rank_refusal
        groups, placed = groups[:1], [(ranked, "main")]
    elif is_pd(spec) and not (builder or router_host):
        spec, placed, pd_refusal = place_pd(settings, spec, groups, place.groups, address)
        refusal = refusal or pd_refusal
        groups = groups[: len(placed)]
    drift = probe.get("release_drift") or {}  # release id -> how it differs from its install
    complete = release.id in probe.get("releases", []) and release.id not in drift
    reinstalled = not complete  # (a release another run set aside, or left half-installed)
    # serve_verify (#36): a model whose files differ from its fetch is fetched again (into
    # staging, renamed over it); a cache that differs from its seal is not warm: dropped and
    # warmed again
    model_drift = probe.get("model_drift") or {}
    fp = spec.compile_fingerprint
    cache_drift = ((probe.get("cache_drift") or {}).get(fp) or []) if fp else []
    instances = []
    for i, devices in enumerate(groups):
        port = settings.serve_base_port + i
        server, role = placed[i]
        guard = guard_commands(group, rendezvous_ports(server.argv)) if group and server else None
        text, sha, argv, env = instance_unit(settings, spec, release, i, devices, platform,
                                             server, (group.name, group.sha) if group else None,
                                             guard)  # fmt: skip
        unit = unit_name(i)
        on_host = units.get(unit, {})
        written = on_host.get("file") == hashlib.sha256(text.encode()).hexdigest()
        converged = (
            on_host.get("active") == "active"
            and on_host.get("running") == sha
            and on_host.get("key_current") is not False  # it runs with the key file's key
            and not on_host.get("older_than_release")  # started before its release's install
            and not on_host.get("after_good")  # a group's rank a killed run left ungated
            and not reinstalled  # its release installs (again) first: then it restarts onto it
        )
        serves = HEADLESS not in argv
        worker = (
            worker_url(settings, port, address if fleet else None) if routed and serves else None
        )
        instances.append(Instance(i, unit, port, devices, text, sha, written, converged,
                                  tuple(argv), tuple(sorted(env.items())), worker, role,
                                  serves))  # fmt: skip
    if instances and instances[-1].port > MAX_PORT:
        raise DataError(
            f"serve_base_port: {settings.serve_base_port} + {len(instances) - 1} instances ends at port "
            f"{instances[-1].port}; allowed: the whole range within 1-{MAX_PORT}"
        )
    names = {inst.unit for inst in instances}
    router, router_release, routers = None, None, place.fleet_routers if fleet else ()
    if settings.router_per_host and not builder:
        router = host_router(settings, [i.port for i in instances],
                             [i.worker or "" for i in instances], [i.role for i in instances],
                             probe)  # fmt: skip
        # a P/D router's worker API cannot put a worker back (its /add_worker wants the
        # role's own call): its instances are not taken out of rotation
        router_release, routers = router.release, () if router.roles else (router.admin,)
    elif fleet and any(i.role != "main" for i in instances):
        routers = ()  # a P/D router's worker API cannot put a worker back
    elif router_host:  # its workers are known once the run's other hosts are planned
        router_release = plan_router_release(settings)
        router = plan_router(settings, router_release, (), probe.get("router"),
                             probe.get("releases", []))  # fmt: skip
    return HostPlan(
        settings=settings,
        spec=spec,
        hardware=hardware,
        platform=platform,
        refusal=refusal,
        driver_needed=driver_needed,
        release=release,
        release_complete=complete,
        release_verified=probe.get("verified") or {},
        release_drift=tuple(
            f"release {r}: {line}" for r, lines in sorted(drift.items()) for line in lines
        ),  # fmt: skip
        current=probe.get("current"),
        current_pins=probe.get("current_pins"),
        current_files=probe.get("current_files") or {},
        instances=tuple(instances),
        stale_units=tuple(u for u in units if u not in names),
        active_units=frozenset(u for u, st in units.items() if st.get("active") == "active"),
        warm=fp is None or (fp in probe.get("warm", []) and not cache_drift),
        missing_models=tuple(
            m
            for m in spec.requirements.models
            if m not in probe.get("models", []) or m in model_drift
        ),
        model_drift=tuple(
            f"model {m}: {line}"
            for m in spec.requirements.models
            for line in model_drift.get(m, ())
        ),
        cache_drift=tuple(f"cache {fp}: {line}" for line in cache_drift),
        kernel=kernel,
        python=probe.get("python"),
        reload_needed=any(st.get("reload") for st in units.values()),
        good_release=probe.get("good"),
        good_shas=tuple(probe.get("good_shas", ())),
        good_servefleet=_version_word(probe.get("good_servefleet")),
        units=units,
        paths=probe.get("paths", {}),
        account=account,
        group_exists=bool(probe.get("group")),
        nft=probe.get("nft") is True,
        builder=builder,
        secret_key=secret_key,
        preflights=frozenset(probe.get("preflight") or ()),
        router=router,
        router_stale=router is None
        and not router_host
        and bool((probe.get("router") or {}).get("file")),
        router_release=router_release,
        router_host=router_host,
        routers=routers,
        group=group,
    )


def wheelhouse_copies(plan: HostPlan) -> list[Copy]:
    """With ``sdk_source = "wheelhouse"``, the wheelhouse files the host's steps need this run:
    the release's packages unless it is installed, the driver runfile when the driver is
    installed, the archives of the missing models (none for a refused host or another source).

    + plan: the host's plan
    """
    s = plan.settings
    if s.sdk_source != "wheelhouse" or plan.refusal or not s.sdk_lock or not s.sdk_wheelhouse:
        return []
    return host_copies(
        s.sdk_wheelhouse,
        s.serve_root,
        load_lock(s.sdk_lock),
        None if plan.release_complete else plan.release.pylock,
        s.driver_version if plan.driver_needed else None,
        plan.missing_models,
    )
