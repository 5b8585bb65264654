"""What one host needs, computed from its data, its recipe and one probe of its state.

Pure (no pyinfra import): the deploys turn a HostPlan into operations. Everything a host's
operations depend on is decided here, once, before any operation is added.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import hmac
import json
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from servefleet.base.errors import DataError, RecipeError
from servefleet.base.flags import merge, table_for
from servefleet.base.shipped import VLLM_FLAGS_DIR
from servefleet.base.version import VERSION
from servefleet.hostplan.router import RouterPlan, admin_url, plan_router, worker_url
from servefleet.kinds import Hardware, Kind, kind_named, kind_of
from servefleet.kinds.roles import DECODE, PREFILL, bind, is_pd, one_host_values
from servefleet.release.glibc import glibc_refusal, host_glibc, levels
from servefleet.release.lock import load_lock
from servefleet.release.plan import (
    ReleasePlan,
    plan_release,
    plan_router_release,
    shipped_files,
    unlocked,
)
from servefleet.release.uvbin import host_uv
from servefleet.release.wheelhouse import Copy, host_copies
from servefleet.remote.layout import (
    API_KEY_FILE,
    API_KEY_VAR,
    HF_TOKEN_FILE,
    LIB,
    NETRC,
    PLANS,
    PROXY_CONF,
    PROXY_UNIT,
    RELEASE_FILES,
    RELEASES,
    ROUTER_ADMIN_KEY,
    ROUTER_ADMIN_MAP,
    ROUTER_UNIT,
    SECRETS_DIR,
    STATE,
    UNIT_DIR,
    UNIT_SHA_VAR,
    unit_name,
)
from servefleet.render.units import render_unit
from servefleet.settings.checks import MAX_PORT
from servefleet.settings.table import Settings
from servefleet.spec import Server, ServeSpec

__all__ = ["Hardware", "HostPlan", "plan_host"]

_KERNEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~_-]{0,127}")  # `uname -r`, as apt names take it
REMOTE_SCRIPTS = (
    "layout.py", "trusted.py", "retry.py", "install_release.py", "fetch_model.py", "hub_client.py",
    "health.py", "instances.py", "prewarm.py", "driver.py", "preflight.py", "trees.py",
)  # fmt: skip
NOLOGIN = "/usr/sbin/nologin"  # the shell of the serve user a deploy creates
LOGIN_SHELLS_EXCLUDED = (NOLOGIN, "/sbin/nologin", "/bin/false", "/usr/bin/false")


@dataclass(frozen=True)
class Instance:
    """One ``vllm serve`` process: a unit, a port, a group of NPUs."""

    index: int
    unit: str
    port: int
    devices: str
    text: str  # the rendered unit file
    sha: str  # its SERVEFLEET_UNIT: sha256 of the text without that line (first 16 hex)
    written: bool  # the unit file on the host is this text already
    converged: bool  # its unit is active and its main process runs this sha
    argv: tuple[str, ...] = ()  # its command line (ExecStart=), what the pre-flight checks
    env: tuple[tuple[str, str], ...] = ()  # its Environment= (the unit's sha aside)
    worker: str | None = None  # how the routers in front reach it (None: no router)
    role: str = "main"  # its serving role (prefill, decode: behind the host's router)

    def to_json(self, fingerprint: str) -> dict[str, Any]:
        return {
            "role": self.role,
            "worker": self.worker,
            "unit": self.unit,
            "sha": self.sha,
            "port": self.port,
            "devices": self.devices,
            "fingerprint": fingerprint,
            "text": self.text,
        }


@dataclass(frozen=True)
class HostPlan:
    settings: Settings
    spec: ServeSpec
    hardware: Hardware
    refusal: str | None  # why this host must not be touched (wrong SKU, no NPU), or None
    driver_needed: bool
    release: ReleasePlan
    release_complete: bool
    current: str | None  # the release `current` points at now
    current_pins: dict[str, str] | None  # what that release holds (its completion marker)
    current_files: dict[str, Any]  # package -> [version, sha256s] it was installed with (plan)
    instances: tuple[Instance, ...]
    stale_units: tuple[str, ...]  # our units beyond the instances this host now runs
    active_units: frozenset[str]
    warm: bool  # the compile cache is warm for spec.compile_fingerprint
    missing_models: tuple[str, ...]
    kernel: str
    python: str | None  # major.minor of the host's sdk_python (None: it does not run)
    reload_needed: bool  # systemd has not loaded some unit file as it is on disk
    good_release: str | None  # the release of the host's last converged state
    good_shas: tuple[str, ...]  # the unit shas of that state, in instance order
    good_servefleet: str | None  # the servefleet version that converged it (status shows it)
    units: dict[str, dict[str, Any]]  # our units as the probe found them (active, running sha)
    paths: dict[str, dict[str, str] | None]  # watched_paths() as the probe found them
    account: dict[str, Any] | None  # serve_user's passwd entry (uid, shell, home, group)
    group_exists: bool  # serve_user's group
    builder: bool = False  # serve_prewarm_host: compiles only, serves nothing
    wheelhouse: tuple[Copy, ...] = ()  # sdk_source wheelhouse: the files this run's steps need
    wheelhouse_missing: frozenset[str] = frozenset()  # their host paths the host lacks
    secret_key: bytes = field(default=b"", repr=False)  # the probe's key for secrets' digests
    preflights: frozenset[str] = frozenset()  # the pre-flight keys that passed on this host
    router: RouterPlan | None = None  # serve_router = "host": the router in front of them
    router_stale: bool = False  # a router unit of ours is on the host, and none is wanted
    router_release: ReleasePlan | None = None  # the release of the router this host runs
    router_host: bool = False  # serve_router = "fleet" and in serve_router_group: routes only
    routers: tuple[str, ...] = ()  # the worker APIs an instance leaves and rejoins at a restart

    @property
    def preflight_input(self) -> list[dict[str, Any]]:
        """What ``remote/preflight.py`` checks: each instance's unit, command line and env."""
        return [{"unit": i.unit, "argv": list(i.argv), "env": dict(i.env)} for i in self.instances]

    @property
    def preflight_key(self) -> str:
        """The hash of the release and every instance's command line and env: a pre-flight that
        passed for it once (its marker in ``state/preflight``) is not run again."""
        doc = {"release": self.release.id, "instances": self.preflight_input}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def preflight_needed(self) -> bool:
        """Some instance will restart on a command line its release's vLLM has not passed."""
        return (
            bool(self.instances)
            and not self.converged
            and (self.preflight_key not in self.preflights)
        )

    def from_wheelhouse(self, kind: str, name: str) -> Copy | None:
        """The host's wheelhouse copy of what a step needs (the driver version, a model id)."""
        return next((c for c in self.wheelhouse if (c.kind, c.name) == (kind, name)), None)

    @property
    def platform(self) -> Kind:
        """What differs by hardware, for this host's recipe."""
        return kind_named(self.spec.kind)

    def digest(self, path: str, data: bytes) -> str:
        """The digest the probe reports for ``path`` holding ``data``: a secret's is its HMAC
        under :attr:`secret_key` (``remote/probe.py``), any other file's its sha256."""
        if posixpath.dirname(path) == SECRETS_DIR:
            return hmac.new(self.secret_key, data, "sha256").hexdigest()
        return hashlib.sha256(data).hexdigest()

    def has(
        self, path: str, kind: str, mode: str, user: str = "root", sha256: str | None = None
    ) -> bool:
        """``path`` is there as a ``kind`` ("dir"/"file") with this mode, owned user:user, and
        (for files) this content: a deploy adds no operation for it."""
        found = self.paths.get(path)
        return bool(found) and found == {
            "type": kind,
            "mode": mode,
            "user": user,
            "group": user,
            **({"sha256": sha256} if kind == "file" else {}),
        }

    @property
    def account_ok(self) -> bool:
        """serve_user and its group exist as a deploy makes them."""
        a, s = self.account or {}, self.settings
        want = {"shell": NOLOGIN, "home": s.serve_home, "group": s.serve_user}
        return self.group_exists and all(a.get(k) == v for k, v in want.items())

    @property
    def lib(self) -> str:
        return f"{self.settings.serve_root}/{LIB}"

    @property
    def state_dir(self) -> str:
        return f"{self.settings.serve_root}/{STATE}"

    @property
    def restart_order(self) -> tuple[Instance, ...]:
        """The instances in the order the converge restarts them: decode servers before
        prefill servers (a prefill that restarts first would hand its blocks to decodes that
        are about to go), otherwise by index."""
        return tuple(sorted(self.instances, key=lambda i: i.role != DECODE))

    @property
    def key_file_current(self) -> bool:
        """The servers' API key file holds the data's key (or none is wanted): else the deploy
        writes it, and every server restarts with it."""
        key = self.settings.api_key
        if not key or not self.instances:
            return True
        line = api_key_file(key).encode()
        return self.has(API_KEY_FILE, "file", "600", sha256=self.digest(API_KEY_FILE, line))

    @property
    def converged(self) -> bool:
        """Every instance runs its desired unit, the cache is warm, nothing stale is left, and
        the host's kept good state is this one (a run that died before recording it converges
        again: nothing restarts, the state is recorded)."""
        return (
            all(i.converged and i.written for i in self.instances)
            and self.key_file_current
            and self.warm
            and not self.stale_units
            and not self.reload_needed
            and self.good_shas == tuple(i.sha for i in self.restart_order)
            and self.good_release == self.release.id
            and (self.router is None or self.router_host or self.router.converged)
            and not self.router_stale
        )

    def desired_state(self) -> dict[str, Any]:
        """What ``remote/instances.py converge`` brings the host to (unit texts included: it
        writes them, so a restore or an interrupted run in between can never leave a unit file
        that differs from what it restarts)."""
        s = self.settings
        return {
            "root": s.serve_root,
            "release": self.release.id,
            "model": served_name(self.spec.servers[0].argv, self.spec.requirements.models[0]),
            "host": s.serve_host,
            "cache_root": s.serve_cache_root,
            "devices_env": self.platform.devices_env_for(self.hardware),
            "health_timeout": s.serve_health_timeout,
            "prewarm_timeout": self.platform.first_start_timeout(s),
            "instances": [
                i.to_json(self.spec.compile_fingerprint or "-") for i in self.restart_order
            ],
            "pd": is_pd(self.spec),
            "stale": list(self.stale_units),
            "router": self.router.to_json() if self.router else None,
            "routers": list(self.routers),
            "servefleet": VERSION,  # who converged it (status shows it)
        }


def _version_word(value: Any) -> str | None:
    """A version string from a host's state, or None for anything else (odd probe output)."""
    if isinstance(value, str) and re.fullmatch(r"[0-9A-Za-z.+!_-]{1,64}", value):
        return value
    return None


def resolve_for(settings: Settings, sku: str | None = None) -> ServeSpec:
    """The serving spec the data selects, for the host's device model (its platform resolves),
    with the data's extra arguments and environment (:func:`with_extras`).

    + settings: validated data
    + sku: the host's device model, once known (RBLN: the NPU SKU)
    """
    platform = kind_of(settings.serve_recipe)
    return with_extras(settings, platform.resolve_data(settings, sku), platform)


def with_extras(settings: Settings, spec: ServeSpec, platform: Kind) -> ServeSpec:
    """``serve_extra_args`` / ``serve_extra_env`` appended to each serving server's argv and env,
    checked against the flag table of the hosts' platform (a flag or variable the recipe sets
    is refused unless ``serve_override_args`` names it; then the extra replaces it).

    The compile fingerprint then covers the extras too: a change of them counts as a recompile
    (its first start gets the pre-warm's time, alone), whether or not vllm-rbln's cache key
    holds them. What the release installs, the models and the devices never depend on them
    (the flags that decide those are refused).
    """
    s = settings
    if not (s.serve_extra_args or s.serve_extra_env or s.serve_override_args):
        return spec

    def extended(server: Server) -> Server:
        argv, env = merge(server.argv, server.env, s.serve_extra_args, s.serve_extra_env,
                          s.serve_override_args, table_for(platform.name))  # fmt: skip
        return dataclasses.replace(server, argv=argv, env=env)

    fingerprint = spec.compile_fingerprint
    if fingerprint is not None:
        extras = [list(s.serve_extra_args), s.serve_extra_env, list(s.serve_override_args)]
        text = fingerprint + "\n" + json.dumps(extras, sort_keys=True)
        fingerprint = hashlib.sha256(text.encode()).hexdigest()
    serving = ("main", PREFILL, DECODE)
    servers = [extended(x) if x.role in serving else x for x in spec.servers]
    return dataclasses.replace(spec, servers=servers, compile_fingerprint=fingerprint)


def api_key_file(key: str) -> str:
    """The servers' EnvironmentFile (``remote/layout.py`` API_KEY_FILE): the key as vLLM reads it
    (the key's characters need no quoting: ``checks.API_KEY``)."""
    return f"{API_KEY_VAR}={key}\n"


# The options whose value names a file the server reads (vLLM resolves a relative one from its
# working directory; a chat template also among the wheel's own)
FILE_OPTIONS = ("--chat-template", "--tool-parser-plugin")
CHAT_TEMPLATES = VLLM_FLAGS_DIR / "vllm-0.30.0-chat-templates.txt"  # what the vllm wheel ships


def shipped_paths(args: Sequence[str], release: ReleasePlan) -> list[str]:
    """``args`` with each path ``serve_files`` ships replaced by the release's copy, and a file
    option's relative path that neither it nor the vllm wheel provides refused (DataError)."""
    shipped = {f.argv: f"{release.path}/{RELEASE_FILES}/{f.name}" for f in release.files}
    out: list[str] = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("--") and value in shipped:
            out.append(f"{flag}={shipped[value]}")
            continue
        out.append(shipped.get(arg, arg))
        before = args[i - 1] if i else ""
        if before in FILE_OPTIONS and arg not in shipped:
            _refuse_unshipped(before, arg)
        elif eq and flag in FILE_OPTIONS:
            _refuse_unshipped(flag, value)
    return out


def _refuse_unshipped(flag: str, path: str) -> None:
    """A file option's value the host cannot have: a relative path (vLLM reads it from the
    server's working directory, /) that is not a template the wheel ships."""
    if posixpath.isabs(path):
        return
    templates = _wheel_templates()
    if flag == "--chat-template" and (any(c in path for c in "{}\n") or path in templates):
        return
    shown = f" (the wheel's: {', '.join(sorted(templates))})" if flag == "--chat-template" else ""
    raise DataError(
        f"{flag} {path}: a relative path that the vllm wheel does not ship{shown}; allowed: "
        f"ship it with serve_files = {{{path!r}: '<the file on the controller>'}}, or an "
        "absolute path on the host"
    )


@functools.lru_cache(maxsize=1)
def _wheel_templates() -> frozenset[str]:
    return frozenset(x.strip() for x in CHAT_TEMPLATES.read_text().splitlines() if x.strip())


def instance_command(
    settings: Settings,
    spec: ServeSpec,
    release: ReleasePlan,
    index: int,
    devices: str,
    devices_env: str | None = None,
    server: Server | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment instance ``index`` runs with (its unit's ExecStart= and
    Environment=, before the unit's own sha): what the pre-flight checks (arguments as
    :func:`render_instance`; ``server``: the spec's server it runs, default its first)."""
    server = server or spec.servers[0]
    port = settings.serve_base_port + index
    exec_argv = [f"{release.path}/bin/{server.argv[0]}", *shipped_paths(server.argv[1:], release),
                 "--port", str(port)]  # fmt: skip
    if settings.serve_host:
        exec_argv += ["--host", settings.serve_host]
    exec_argv += ["--shutdown-timeout", str(settings.serve_shutdown_timeout)]
    env = dict(server.env)
    env.update(
        {devices_env or kind_named(spec.kind).devices_env: devices},
        VLLM_CACHE_ROOT=settings.serve_cache_root,
        HOME=settings.serve_home,
        HF_HOME=settings.models_hf_home,
        HF_HUB_OFFLINE="1",
    )
    return exec_argv, env


def render_instance(
    settings: Settings, spec: ServeSpec, release: ReleasePlan, index: int, devices: str,
    devices_env: str | None = None, server: Server | None = None,
) -> tuple[str, str]:  # fmt: skip
    """The unit file of one instance and its SERVEFLEET_UNIT sha (pure: the deploy writes this
    text, ``servefleet resolve --format unit`` prints it).

    + settings: validated data (user, paths, base port, host)
    + spec: the resolved selection (its first server)
    + release: the release the instance runs from
    + index: the instance (port ``serve_base_port + index``)
    + devices: its devices (``0,1``)
    + devices_env: the variable that gives them (default: the spec's platform's)
    + server: the spec's server it runs (default: the first)
    """
    exec_argv, env = instance_command(settings, spec, release, index, devices, devices_env, server)
    port = settings.serve_base_port + index
    fields: dict[str, Any] = dict(
        exec_argv=exec_argv,
        recipe=spec.recipe,
        selection=spec.selection,
        fingerprint=spec.compile_fingerprint,
        index=index,
        port=port,
        devices=devices,
        user=settings.serve_user,
        device_word=kind_named(spec.kind).device_word,
        # systemd waits this long for the stop before SIGKILL: the drain and 30 s more
        stop_timeout=settings.serve_shutdown_timeout + 30,
        environment_file=API_KEY_FILE if settings.api_key else None,
    )
    # the unit's text only: no digest of the API key (world-readable, it would let a guess be
    # confirmed offline, #31 finding 4); a new key restarts the servers because each one is
    # checked for the key it runs with (the probe, remote/instances.py)
    sha = hashlib.sha256(render_unit(env=env, **fields).encode()).hexdigest()[:16]
    return render_unit(env={**env, UNIT_SHA_VAR: sha}, **fields), sha


def plan_host(
    settings: Settings,
    probe: dict[str, Any],
    spec: ServeSpec | None = None,
    builder: bool = False,
    secret_key: bytes = b"",
    router_host: bool = False,
    address: str | None = None,
    fleet_routers: Sequence[str] = (),
    host_groups: Sequence[str] = (),
) -> HostPlan:
    """Everything one host needs, from its validated data and its probe.

    + settings: the host's validated data
    + probe: the output of the probe (``remote/probe.py``) on the host
    + spec: ``resolve_for(settings)``, when the caller has it already
    + builder: the host is ``serve_prewarm_host``: it needs no NPU and no driver; it compiles
      (compile only) for the recipe's first SKU, as the first instance of a host with NPUs
    + secret_key: the key the probe was given for the secrets' digests (``probe_args(keyed)``)
    + router_host: ``serve_router = "fleet"`` and the host is in ``serve_router_group``: it runs
      a router only (no device, driver or server of its own)
    + address: how other hosts reach this one (the inventory's): a fleet router's workers
    + fleet_routers: the worker APIs of the fleet's routers (``serve_router = "fleet"``)
    + host_groups: the inventory groups of the host (``serve_roles`` places a role by group)
    """
    platform = kind_of(settings.serve_recipe)
    spec = spec or resolve_for(settings)
    hardware = platform.hardware(probe)
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
        refusal = platform.refusal(settings, spec, hardware)
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
    fleet = settings.serve_router == "fleet"
    routed = settings.serve_router == "host" or (fleet and bool(fleet_routers))
    devices_env = platform.devices_env_for(hardware)
    placed: list[tuple[Server | None, str]] = [(None, "main")] * len(groups)
    if is_pd(spec) and not (builder or router_host):
        spec, placed, pd_refusal = _place_pd(settings, spec, groups, host_groups, address)
        refusal = refusal or pd_refusal
        groups = groups[: len(placed)]
    instances = []
    for i, devices in enumerate(groups):
        port = settings.serve_base_port + i
        server, role = placed[i]
        text, sha = render_instance(settings, spec, release, i, devices, devices_env, server)
        argv, env = instance_command(settings, spec, release, i, devices, devices_env, server)
        unit = unit_name(i)
        on_host = units.get(unit, {})
        written = on_host.get("file") == hashlib.sha256(text.encode()).hexdigest()
        converged = (
            on_host.get("active") == "active"
            and on_host.get("running") == sha
            and on_host.get("key_current") is not False  # it runs with the key file's key
        )
        worker = worker_url(settings, port, address if fleet else None) if routed else None
        instances.append(Instance(i, unit, port, devices, text, sha, written, converged,
                                  tuple(argv), tuple(sorted(env.items())), worker, role))  # fmt: skip
    if instances and instances[-1].port > MAX_PORT:
        raise DataError(
            f"serve_base_port: {settings.serve_base_port} + {len(instances) - 1} instances ends at port "
            f"{instances[-1].port}; allowed: the whole range within 1-{MAX_PORT}"
        )
    names = {inst.unit for inst in instances}
    router, router_release, routers = None, None, tuple(fleet_routers) if fleet else ()
    if settings.serve_router == "host" and not builder:
        router = _router_for(settings, instances, probe)
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
        refusal=refusal,
        driver_needed=driver_needed,
        release=release,
        release_complete=release.id in probe.get("releases", []),
        current=probe.get("current"),
        current_pins=probe.get("current_pins"),
        current_files=probe.get("current_files") or {},
        instances=tuple(instances),
        stale_units=tuple(u for u in units if u not in names),
        active_units=frozenset(u for u, st in units.items() if st.get("active") == "active"),
        warm=spec.compile_fingerprint is None or spec.compile_fingerprint in probe.get("warm", []),
        missing_models=tuple(
            m for m in spec.requirements.models if m not in probe.get("models", [])
        ),
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
    )


def _place_pd(
    settings: Settings,
    spec: ServeSpec,
    groups: list[str],
    host_groups: Sequence[str] = (),
    address: str | None = None,
) -> tuple[ServeSpec, list[tuple[Server | None, str]], str | None]:
    """A prefill/decode selection on this host. Without ``serve_roles``: ``serve_pd_pairs``
    prefill servers on the first device groups, as many decode servers on the next, behind the
    host's router. With it: every device group serves the role whose group the host is in,
    behind a fleet router. The placeholders are bound to this host (each pool's node is the
    server itself: :func:`servefleet.kinds.roles.one_host_values`); the k-th server of a role on
    a host (from 0) listens for NIXL on the recipe's side-channel port + 10 k. Returns the
    bound spec, each instance's (server, role), and a refusal when the host cannot serve it."""
    if settings.api_key:  # measured with vllm-router 0.1.17; its source: vllm_pd_router.rs
        raise DataError(
            "creds_api_key_env: an API key, but the selection has the roles prefill and decode, "
            "and vllm-router's prefill/decode mode sends its workers its own OPENAI_API_KEY, "
            "never the client's, and checks no key itself: behind it the servers' key would "
            "guard nothing; allowed: no API key (keep serve_router_port on a trusted network)"
        )
    if settings.serve_roles:
        return _place_by_group(settings, spec, groups, host_groups, address)
    if settings.serve_router != "host":
        raise DataError(
            f"serve_router: {settings.serve_router!r}, but the selection has the roles prefill "
            "and decode, which are served behind the host's router (or set serve_roles); "
            "allowed: host"
        )
    here = settings.serve_host or "127.0.0.1"
    spec = bind(spec, one_host_values(here, here, settings.serve_router_port))
    by_role = {x.role: x for x in spec.servers}
    prefill, decode = by_role[PREFILL], by_role[DECODE]
    if prefill.npus != decode.npus:
        raise DataError(
            f"serve_recipe: its prefill and decode servers need {prefill.npus} and "
            f"{decode.npus} devices; allowed: a selection whose roles need as many"
        )
    pairs = settings.serve_pd_pairs
    refusal = None
    if len(groups) < 2 * pairs:
        refusal = (
            f"the host has {len(groups)} device groups of {prefill.npus}; serve_pd_pairs {pairs} "
            f"needs {2 * pairs} (a prefill and a decode server each)"
        )
    placed: list[tuple[Server | None, str]] = []
    for role, server in ((PREFILL, prefill), (DECODE, decode)):
        for k in range(pairs):
            placed.append((_side_channel(server, k), role))
    return spec, placed, refusal


def _place_by_group(
    settings: Settings,
    spec: ServeSpec,
    groups: list[str],
    host_groups: Sequence[str],
    address: str | None,
) -> tuple[ServeSpec, list[tuple[Server | None, str]], str | None]:
    """``serve_roles``: this host serves the role whose inventory group it is in."""
    roles = settings.serve_roles
    if settings.serve_router != "fleet" or set(roles) != {PREFILL, DECODE}:
        raise DataError(
            f"serve_roles: {dict(roles)!r} places each role on the hosts of a group, behind a "
            "fleet router; allowed: both prefill and decode named, with serve_router = 'fleet'"
        )
    mine = [r for r in (PREFILL, DECODE) if roles[r] in host_groups]
    if len(mine) != 1:
        where = "both" if mine else "neither"
        return (
            spec,
            [],
            (
                f"serve_roles: this host is in {where} of the groups {roles[PREFILL]!r} (prefill) and "
                f"{roles[DECODE]!r} (decode); allowed: a host of one of them"
            ),
        )
    here = settings.serve_host or address or "127.0.0.1"
    spec = bind(spec, one_host_values(here, here, settings.serve_router_port))
    server = next(x for x in spec.servers if x.role == mine[0])
    return spec, [(_side_channel(server, k), mine[0]) for k in range(len(groups))], None


SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
SIDE_CHANNEL_DEFAULT = 5600  # vLLM's, when the recipe sets none


def _side_channel(server: Server, k: int) -> Server:
    """The k-th server of a role on a host: its own NIXL side-channel port (unique per host)."""
    if k == 0:
        return server
    base = server.env.get(SIDE_CHANNEL_PORT, str(SIDE_CHANNEL_DEFAULT))
    port = int(base) + 10 * k if base.isdigit() else SIDE_CHANNEL_DEFAULT + 10 * k
    return dataclasses.replace(server, env={**server.env, SIDE_CHANNEL_PORT: str(port)})


def _router_for(
    settings: Settings, instances: Sequence[Instance], probe: dict[str, Any]
) -> RouterPlan:
    """The host's router over its instances; its ports must be none of theirs."""
    ports = [i.port for i in instances]
    for key in ("serve_router_port", "serve_router_metrics_port"):
        port = getattr(settings, key)
        if port in ports:
            raise DataError(
                f"{key}: {port} is an instance's port (serve_base_port {settings.serve_base_port}"
                f" + {ports.index(port)}); allowed: a port outside {ports[0]}-{ports[-1]}"
            )
    release = plan_router_release(settings)
    workers = [i.worker or "" for i in instances]
    roles = [i.role for i in instances] if any(i.role != "main" for i in instances) else []
    return plan_router(settings, release, workers, probe.get("router"), probe.get("releases", []),
                       roles)  # fmt: skip


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


def served_name(argv: list[str], model: str) -> str:
    """The name clients (and the health gate's chat) must ask for: the first
    ``--served-model-name``, else the model."""
    for i, arg in enumerate(argv):
        if arg.replace("_", "-") == "--served-model-name" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.replace("_", "-").startswith("--served-model-name="):
            return arg.split("=", 1)[1]
    return model


def watched_paths(settings: Settings, *release_ids: str) -> list[str]:
    """Every directory and file a deploy manages outside releases and units: the probe stats
    them (and hashes the files), so a run that would change none of them adds no operation.

    + release_ids: ids of the releases the host may get (by its glibc): their plan files
    """
    root = settings.serve_root
    lib = [f"{root}/{LIB}/{script}" for script in REMOTE_SCRIPTS]
    dirs = [root, *(f"{root}/{d}" for d in (LIB, PLANS, RELEASES, STATE))]
    dirs += [SECRETS_DIR, settings.serve_cache_root, settings.models_hf_home]
    uv = [host_uv(root)] if settings.sdk_installer == "uv" else []
    plans = [f"{root}/{PLANS}/{i}.json" for i in dict.fromkeys(release_ids)]
    shipped = []  # serve_files: each release's files/ and what it holds
    for i in dict.fromkeys(release_ids) if settings.serve_files else ():
        top = f"{root}/{RELEASES}/{i}/{RELEASE_FILES}"
        shipped += [top, *(f"{top}/{f.name}" for f in shipped_files(settings))]
    if settings.serve_router != "none":  # the router's release: its plan file
        with contextlib.suppress(DataError):  # not locked: plan_host says why
            plans.append(f"{root}/{PLANS}/{plan_router_release(settings).id}.json")
    proxy = [PROXY_CONF, f"{UNIT_DIR}/{PROXY_UNIT}", ROUTER_ADMIN_MAP, ROUTER_ADMIN_KEY]
    return [*dirs, *lib, *uv, *plans, *shipped, NETRC, HF_TOKEN_FILE, API_KEY_FILE, *proxy]


def _router_admin(settings: Settings) -> str | None:
    """Where the probe asks the host's router which workers it lists (None: no router)."""
    return None if settings.serve_router == "none" else admin_url(settings)


def probe_args(
    settings: Settings, spec: ServeSpec, files: bool = False, keyed: bool = False
) -> str:
    """The probe's one argument (JSON, ``remote/probe.py``): paths, the serve user and the wanted models.

    + files: also read the file hashes the serving release was installed with (``plan``)
    + keyed: the probe reads a key on stdin and reports the secrets' digests as HMACs under it
      (without: no digest for them)
    """
    models = {m: settings.models_revisions.get(m) for m in spec.requirements.models}
    # the release depends on the host's glibc, which this probe reads: watch each one's plan
    ids = []
    for glibc in levels(settings.pip_indexes):
        try:
            ids.append(plan_release(settings, spec, NETRC, glibc).id)
        except DataError:  # not locked (no host can install it) or bad: plan_host says why
            continue
    return json.dumps(
        {
            "root": settings.serve_root,
            "hf_home": settings.models_hf_home,
            "cache_root": settings.serve_cache_root,
            "user": settings.serve_user,
            "accelerators": [list(c) for c in kind_of(settings.serve_recipe).probe_commands],
            "models": models,
            "paths": watched_paths(settings, *ids),
            "files": files,
            "keyed": keyed,
            "python": settings.sdk_python,
            "router": {"unit": ROUTER_UNIT, "url": _router_admin(settings)},
        },
        sort_keys=True,
    )
