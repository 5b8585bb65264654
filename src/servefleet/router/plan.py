"""The router in front of a host's instances (``serve_router = "host"``): vLLM's own
``vllm-router`` from its own release, as its own user, its argv rendered from the data.

vllm-router serves its worker API (``/add_worker``, ``/remove_worker``, ``/list_workers``, ...)
on its one port, unguarded: 0.1.17 checks no key there (``--api-key`` is what it sends its
workers) and listens on no Unix socket, so anyone who reached it could route clients, and their
keys and prompts, to a host of theirs. It listens on loopback only (``serve_router_backend_port``),
behind nginx (its proxy, :func:`render_proxy`), which passes clients only :data:`CLIENT_PATHS` at
``serve_router_port``; with ``serve_router = "fleet"`` also the worker API the fleet's hosts
drain through, at ``serve_router_admin_port``, only with the routers' admin key. Loopback is
every local user's (#46 item 9): its unit first loads an nftables table (:func:`guard_command`)
that resets a connection to that port from any user but root (the host's converge and probe)
and the router's own (nginx's workers).

Pure (no pyinfra import). What the router routes to is part of its unit text, so its
``SERVEFLEET_UNIT`` changes, and it restarts through its gate (a chat through it), exactly
when its instances change; a rolling restart of the instances takes each one out of the
router's rotation first (``base/remote/rotation.py``: the router's worker API,
``/remove_worker`` and ``/add_worker``), so no client request goes to a server that is stopping.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from servefleet.base.errors import DataError
from servefleet.base.remote.layout import (
    NGINX,
    PROXY_ADMIN_LOADED,
    PROXY_CONF,
    PROXY_LOADED,
    PROXY_RUN,
    PROXY_STARTED,
    PROXY_UNIT,
    ROUTER_ADMIN_MAP,
    ROUTER_GUARD_TABLE,
    ROUTER_UNIT,
    UNIT_SHA_VAR,
)
from servefleet.release.plan import ROUTER_PACKAGE, ReleasePlan, plan_router_release
from servefleet.render.nftables import load_table
from servefleet.router.render import render_proxy_conf, render_proxy_unit, render_router_unit
from servefleet.settings.check_words import API_KEY, API_KEY_ALLOWED
from servefleet.settings.table import Settings

ROUTER_EXECUTABLE = "vllm-router"  # the wheel's console script
LOOPBACK = "127.0.0.1"  # where vllm-router itself listens
# what clients reach through the proxy: the OpenAI API vllm-router serves, and its health
CLIENT_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/readiness")
# what the fleet's hosts reach with the admin key: the worker API their converge drains with
ADMIN_PATHS = ("/add_worker", "/remove_worker", "/workers", "/list_workers")
PROXY_TIMEOUT = 3600  # seconds a request through the proxy may take (a long generation)
PROXY_MAX_BODY = "64m"  # the largest request body it passes


@dataclass(frozen=True)
class ProxyPlan:
    """The router's proxy: its configuration, unit and admin key entry, and how the probe found
    it running."""

    conf: str  # PROXY_CONF's text
    unit_text: str
    sha: str  # its unit's SERVEFLEET_UNIT
    admin_map: str | None  # ROUTER_ADMIN_MAP's text (serve_router fleet), else None
    nginx: bool  # nginx is installed
    nft: bool  # nft is installed (the router's unit loads its guard with it)
    running: bool  # its unit is active and its main process runs this sha
    loaded: bool  # it runs this configuration (and, with an admin key, the one on the host)
    unit: str = PROXY_UNIT


@dataclass(frozen=True)
class RouterPlan:
    """The host's router: its release, unit and what it routes to, and how the probe found it."""

    release: ReleasePlan
    port: int
    admin: str  # where the host's converge reaches its worker API
    workers: tuple[str, ...]  # the instance URLs it routes to, in instance order
    argv: tuple[str, ...]
    text: str  # the rendered unit file
    sha: str  # its SERVEFLEET_UNIT
    release_complete: bool  # the router's release is installed on the host
    written: bool  # the unit file on the host is this text
    running: bool  # its unit is active and its main process runs this sha
    listed: tuple[str, ...] | None  # the workers the running router lists now (None: unknown)
    active: str = "absent"  # its unit's ActiveState as the probe found it
    healthy: dict[str, bool] | None = None  # worker -> healthy, as the router's checks find it
    roles: tuple[str, ...] = ()  # each worker's role (prefill, decode): the router's P/D mode
    types: dict[str, str] = field(default_factory=dict)  # worker -> its type, as the router has it
    found: dict[str, Any] = field(default_factory=dict, repr=False)  # the probe's entry
    releases: tuple[str, ...] = field(default=(), repr=False)  # complete releases on the host
    unit: str = ROUTER_UNIT
    proxy: ProxyPlan | None = None  # its proxy (None only in plans made without a probe)

    def over(
        self, settings: Settings, workers: Sequence[str], roles: Sequence[str] = ()
    ) -> RouterPlan:
        """This router over other workers (with their roles, in P/D mode), as the same probe
        found it (a fleet router's list is known once every host of the run is planned)."""
        return plan_router(settings, self.release, workers, self.found, self.releases, roles)

    @property
    def converged(self) -> bool:
        """Installed, written, running this text, and routing to every instance (a run that died
        with an instance out of rotation is not converged)."""
        return (
            self.release_complete
            and self.written
            and self.running
            and self.listed is not None
            and sorted(self.listed) == sorted(self.workers)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "sha": self.sha,
            "port": self.port,
            "admin": self.admin,
            "workers": list(self.workers),
            "release": self.release.id,
            "text": self.text,
            "pd": bool(self.roles),
        }


def url(host: str, port: int) -> str:
    """``http://host:port`` (an IPv6 address in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def admin_url(settings: Settings, address: str | None = None) -> str:
    """Where a router's worker API is reached: its host's own programs (the probe, the converge)
    at vllm-router's loopback port; another host's through that host's proxy, at ``serve_host``
    or ``address`` (how the inventory reaches it), with the admin key.

    + address: the router host's address, for a fleet router; None: this host's own router"""
    if address is None:
        return url(LOOPBACK, settings.serve_router_backend_port)
    return url(settings.serve_host or address, settings.serve_router_admin_port)


def worker_url(settings: Settings, port: int, address: str | None = None) -> str:
    """How a router reaches an instance: where it listens (``Settings.instance_host``: the
    servers' ``serve_host``, else loopback behind the host's own router), else ``address`` (a
    fleet router on another host: the inventory's address)."""
    return url(settings.instance_host or address or LOOPBACK, port)


def fleet_order(workers: Sequence[str]) -> list[str]:
    """A fleet router's workers in its one order: by port, then host, so that consecutive picks
    of round robin (and a request's retries) go to other hosts, and the unit is the same
    whichever host joined first (``status`` rebuilds it from the router's own list)."""

    def key(worker: str) -> tuple[int, str]:
        where, _, port = worker.rpartition(":")
        return (int(port) if port.isdigit() else 0, where)

    return sorted(workers, key=key)


def router_command(
    settings: Settings,
    release: ReleasePlan,
    workers: Sequence[str],
    roles: Sequence[str] = (),
) -> list[str]:
    """The router's command line (its unit's ExecStart=): every choice is the data's, none is
    left to vllm-router's defaults (its health check would poll once a minute).

    + settings: validated data (``serve_router_*``)
    + release: the router's release
    + workers: the instance URLs
    + roles: each worker's role; prefill and decode put the router in P/D mode (vLLM's
      two-stage requests: the prefill's ``kv_transfer_params`` to a decode)
    """
    s = settings
    bind = s.serve_host or "0.0.0.0"  # its metrics (the proxy is the clients' way in)
    if roles:
        pools = ["--vllm-pd-disaggregation"]
        for worker, role in zip(workers, roles, strict=True):
            pools += [f"--{role}", worker]
    else:
        pools = ["--worker-urls", *workers]
    return [
        f"{release.path}/bin/{ROUTER_EXECUTABLE}",
        "--host", LOOPBACK,
        "--port", str(s.serve_router_backend_port),
        *pools,
        "--policy", s.serve_router_policy,
        "--health-check-endpoint", "/health",
        "--health-check-interval-secs", str(s.serve_router_health_interval),
        "--health-failure-threshold", str(s.serve_router_health_failures),
        "--health-success-threshold", str(s.serve_router_health_successes),
        "--retry-max-retries", str(s.serve_router_retries),
        "--cb-failure-threshold", str(s.serve_router_breaker_failures),
        "--worker-startup-timeout-secs", str(s.serve_health_timeout),
        "--prometheus-host", bind,
        "--prometheus-port", str(s.serve_router_metrics_port),
    ]  # fmt: skip


def guard_command(settings: Settings) -> list[str]:
    """The command the router's unit runs as root before it starts: one nftables transaction
    that (re)makes :data:`ROUTER_GUARD_TABLE`, whose rule resets a new loopback connection to
    vllm-router's port (its first SYN) from a socket of any user but root and
    ``serve_router_user`` (nginx's workers run as it). Any local user could otherwise use the
    worker API that vllm-router 0.1.17 serves without a key (#46 item 9).

    + settings: validated data (``serve_router_backend_port``, ``serve_router_user``)
    """
    rule = (
        f"oif lo tcp dport {int(settings.serve_router_backend_port)} tcp flags & (syn | ack) == syn"
        f' meta skuid != {{ 0, "{settings.serve_router_user}" }} reject with tcp reset'
    )
    return load_table(ROUTER_GUARD_TABLE, "output", [rule])


def render_router(
    settings: Settings, release: ReleasePlan, workers: Sequence[str], roles: Sequence[str] = ()
) -> tuple[str, str, list[str]]:
    """The router's unit text, its SERVEFLEET_UNIT sha and its argv (pure: the host's converge
    writes this text).

    + settings: validated data
    + release: the router's release
    + workers: the instance URLs, in instance order
    """
    argv = router_command(settings, release, workers, roles)
    fields: dict[str, Any] = dict(
        exec_argv=argv,
        guard=guard_command(settings),
        workers=workers,
        port=settings.serve_router_port,
        user=settings.serve_router_user,
        version=settings.serve_router_version,
    )
    # the launcher's setproctitle overwrites /proc/PID/environ (where the host reads which unit
    # text a process runs) unless SPT_NOENV is set
    env = {"SPT_NOENV": "1"}
    sha = hashlib.sha256(render_router_unit(env=env, **fields).encode()).hexdigest()[:16]
    return render_router_unit(env={**env, UNIT_SHA_VAR: sha}, **fields), sha, argv


def _listen(host: str | None, port: int) -> str:
    """nginx's ``listen`` for ``port`` at ``host`` (every IPv4 address without one)."""
    if not host:
        return str(port)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def render_proxy(settings: Settings) -> tuple[str, str, str, str | None]:
    """The proxy's configuration, unit text, unit sha and admin key entry (None without
    ``serve_router = "fleet"``). Pure: the deploy writes these.

    + settings: validated data (``serve_router_*``; with fleet, the admin key)
    """
    s = settings
    fleet = s.router_fleet
    conf = render_proxy_conf(
        listen=_listen(s.serve_host, s.serve_router_port),
        backend=f"{LOOPBACK}:{s.serve_router_backend_port}",
        paths=CLIENT_PATHS,
        admin_listen=_listen(s.serve_host, s.serve_router_admin_port) if fleet else None,
        admin_paths=ADMIN_PATHS,
        run=PROXY_RUN,
        user=s.serve_router_user,
        version=s.serve_router_version,
        timeout=PROXY_TIMEOUT,
        max_body=PROXY_MAX_BODY,
    )
    copies = [["/usr/bin/install", "-m", "0600", PROXY_CONF, PROXY_LOADED]]
    if fleet:
        copies.append(["/usr/bin/install", "-m", "0600", ROUTER_ADMIN_MAP, PROXY_ADMIN_LOADED])
    mark = ["/bin/sh", "-c", f'printf "%s\\n" "${UNIT_SHA_VAR}" > {PROXY_STARTED}']
    fields: dict[str, Any] = dict(
        mark=mark, copies=copies, nginx=NGINX, loaded=PROXY_LOADED, run_name=PROXY_RUN.rsplit("/", 1)[1],
        description=f"servefleet router proxy (nginx: port {s.serve_router_port} -> vllm-router "
        f"on {LOOPBACK}:{s.serve_router_backend_port})", admin=fleet,
    )  # fmt: skip
    sha = hashlib.sha256(render_proxy_unit(env={}, **fields).encode()).hexdigest()[:16]
    unit = render_proxy_unit(env={UNIT_SHA_VAR: sha}, **fields)
    admin = admin_map(s.router_admin_key) if fleet and s.router_admin_key else None
    return conf, unit, sha, admin


def admin_map(key: str) -> str:
    """The proxy's admin key entry (its ``map`` of ``Authorization``): ``Bearer KEY`` exactly,
    case and all (#46 item 10). nginx matches a map's strings ignoring case, so the entry is a
    case-sensitive regex (``~``, not ``~*``), each character of the key that is not a letter or
    a digit escaped.

    + key: the routers' admin key: :data:`API_KEY`'s characters (none that nginx's quoting reads)
    """
    if not API_KEY.fullmatch(key):
        raise DataError("creds_router_admin_key_env: the key (not shown) is not a key servefleet "
                        f"passes on; allowed: {API_KEY_ALLOWED}")  # fmt: skip
    exact = "".join(c if c.isalnum() else "\\" + c for c in key)
    return f'"~^Bearer {exact}$" 1;\n'


def plan_proxy(settings: Settings, found: dict[str, Any] | None) -> ProxyPlan:
    """The router's proxy, from how the probe found it (its ``router`` entry's ``proxy``).

    + settings: validated data
    + found: the probe's ``router.proxy`` entry, or None
    """
    conf, unit_text, sha, admin = render_proxy(settings)
    found = found or {}
    conf_sha = hashlib.sha256(conf.encode()).hexdigest()
    return ProxyPlan(
        conf=conf,
        unit_text=unit_text,
        sha=sha,
        admin_map=admin,
        nginx=found.get("nginx") is True,
        nft=found.get("nft") is True,
        running=found.get("active") == "active" and found.get("running") == sha,
        loaded=found.get("loaded") == conf_sha and (admin is None or found.get("admin") is True),
    )


def plan_router(
    settings: Settings,
    release: ReleasePlan,
    workers: Sequence[str],
    found: dict[str, Any] | None,
    releases: Sequence[str],
    roles: Sequence[str] = (),
) -> RouterPlan:
    """A router over ``workers``, from how the probe found it on its host.

    + settings: validated data
    + release: the router's release (:func:`servefleet.release.plan.plan_router_release`)
    + workers: the instance URLs it routes to (:func:`worker_url`), in order
    + found: the probe's ``router`` entry (its unit and the workers it lists), or None
    + releases: the complete releases on the host
    """
    workers = tuple(workers)
    text, sha, argv = render_router(settings, release, workers, roles)
    found = found or {}
    listed = found.get("workers")
    return RouterPlan(
        release=release,
        port=settings.serve_router_port,
        admin=admin_url(settings),
        workers=workers,
        argv=tuple(argv),
        text=text,
        sha=sha,
        release_complete=release.id in releases,
        written=found.get("file") == hashlib.sha256(text.encode()).hexdigest(),
        running=found.get("active") == "active" and found.get("running") == sha,
        listed=tuple(str(w) for w in listed) if isinstance(listed, list) else None,
        active=str(found.get("active") or "absent"),
        healthy=dict(found["healthy"]) if isinstance(found.get("healthy"), dict) else None,
        types=dict(found["types"]) if isinstance(found.get("types"), dict) else {},
        found=dict(found),
        releases=tuple(releases),
        roles=tuple(roles),
        proxy=plan_proxy(settings, found.get("proxy")),
    )


__all__ = [
    "ADMIN_PATHS",
    "CLIENT_PATHS",
    "ROUTER_PACKAGE",
    "ProxyPlan",
    "RouterPlan",
    "admin_url",
    "fleet_order",
    "guard_command",
    "plan_proxy",
    "plan_router",
    "render_proxy",
    "render_router",
    "url",
    "worker_url",
]


def host_router(
    settings: Settings,
    ports: Sequence[int],
    workers: Sequence[str],
    roles: Sequence[str],
    probe: dict[str, Any],
) -> RouterPlan:
    """The host's router (``serve_router = "host"``) over its instances; its ports must be none
    of theirs.

    + settings: the host's validated data
    + ports: each instance's port, in instance order
    + workers: how the router reaches each instance
    + roles: each instance's serving role (``main``, or prefill and decode: a P/D router)
    + probe: the host's probe output (the router as it found it, the complete releases)
    """
    for key in ("serve_router_port", "serve_router_metrics_port"):
        port = getattr(settings, key)
        if port in ports:
            raise DataError(
                f"{key}: {port} is an instance's port (serve_base_port {settings.serve_base_port}"
                f" + {ports.index(port)}); allowed: a port outside {ports[0]}-{ports[-1]}"
            )
    release = plan_router_release(settings)
    pd_roles = list(roles) if any(role != "main" for role in roles) else []
    return plan_router(settings, release, list(workers), probe.get("router"),
                       probe.get("releases", []), pd_roles)  # fmt: skip
