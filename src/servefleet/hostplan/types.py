"""The plan of one host: :class:`HostPlan`, everything its operations depend on, and its
:class:`Instance` records (one ``vllm serve`` unit each), with what follows from them (whether
the host is converged, its desired state, what the pre-flight checks).

Pure (no pyinfra import): :func:`servefleet.hostplan.plan.plan_host` makes them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

from servefleet.base.remote.layout import API_KEY_FILE, LIB, SECRETS_DIR, STATE
from servefleet.base.version import VERSION
from servefleet.hostplan.instance_unit import api_key_file, served_name
from servefleet.kinds import Hardware
from servefleet.kinds.roles import DECODE, is_pd
from servefleet.platforms.base import Platform
from servefleet.release.plan import ReleasePlan
from servefleet.release.wheelhouse import Copy
from servefleet.router.plan import RouterPlan
from servefleet.settings.table import Settings
from servefleet.spec import ServeSpec

NOLOGIN = "/usr/sbin/nologin"  # the shell of the serve user a deploy creates


@dataclass(frozen=True)
class GroupPlace:
    """A host's rank in a serving group (one model across several hosts; the fleet plan's
    :class:`servefleet.fleet.groups.ServingGroup`).

    + name: the group (``serve_group``)
    + rank: this host's rank (0 serves the group's API)
    + nodes: the group's hosts
    + head: rank 0's address (the rendezvous, ``$HEAD_IP``)
    + sha: the group's hash (every rank's unit carries it)
    + hosts: the group's hosts, by rank
    + addresses: where each host is reached (its ``serve_host``, else the inventory's), by rank:
      the only sources its rendezvous ports answer
    """

    name: str
    rank: int
    nodes: int
    head: str
    sha: str
    hosts: tuple[str, ...]
    addresses: tuple[str, ...] = ()


@dataclass(frozen=True)
class Place:
    """A host's place in the fleet, as the fleet plan (:mod:`servefleet.fleet.fleetplan`) gives
    it; the default is a host alone.

    + address: how other hosts reach it (the inventory's): a fleet router's workers
    + groups: its inventory groups (``serve_roles`` places a role by group)
    + builder: it is ``serve_prewarm_host``: it needs no NPU and no driver; it compiles (compile
      only) for the recipe's first SKU, as the first instance of a host with NPUs
    + router_host: ``serve_router = "fleet"`` and it is in ``serve_router_group``: it runs a
      router only (no device, driver or server of its own)
    + fleet_routers: the worker APIs of the fleet's routers (``serve_router = "fleet"``)
    + group: its rank in a serving group (``serve_group``), or None
    """

    address: str | None = None
    groups: tuple[str, ...] = ()
    builder: bool = False
    router_host: bool = False
    fleet_routers: tuple[str, ...] = ()
    group: GroupPlace | None = None


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
    serves: bool = True  # it serves the API on its port (a headless rank of a group: none)

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
        } | ({} if self.serves else {"serves": False})  # a headless rank: no port to gate


@dataclass(frozen=True)
class HostPlan:
    settings: Settings
    spec: ServeSpec
    hardware: Hardware
    platform: Platform  # the host's hardware platform, as its probe showed it
    refusal: str | None  # why this host must not be touched (wrong SKU, no NPU), or None
    driver_needed: bool
    release: ReleasePlan
    release_complete: bool
    release_drift: tuple[str, ...]  # how its releases differ from their install (#36)
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
    release_verified: dict[str, dict[str, int]] = field(default_factory=dict)  # serve_verify:
    # release id -> the files and bytes the probe read and hashed
    router_release: ReleasePlan | None = None  # the release of the router this host runs
    router_host: bool = False  # serve_router = "fleet" and in serve_router_group: routes only
    routers: tuple[str, ...] = ()  # the worker APIs an instance leaves and rejoins at a restart
    group: GroupPlace | None = None  # its rank in a serving group (the group restarts as one)
    nft: bool = False  # nft is installed (a group's rank loads its rendezvous guard with it)
    model_drift: tuple[str, ...] = ()  # serve_verify: how its models differ from their fetch
    cache_drift: tuple[str, ...] = ()  # ... and its compile cache from its seal (#36)

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
            "models": list(self.spec.requirements.models),  # what a compile-only build reads
            "host": s.instance_host,  # where the gate asks: where the servers listen
            "cache_root": s.serve_cache_root,
            "devices_env": self.platform.devices_env,
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
            **self.compile_only_json(),
        } | ({"group": self.group_json()} if self.group else {})

    def compile_only_json(self) -> dict[str, Any]:
        """What ``remote/prewarm.py build`` adds to the first instance's unit for a compile-only
        start, as its platform says it (``Platform.compile_only_env``: name and value, in order,
        ``{sku}`` for the device model): none for a platform that does not compile."""
        env = self.platform.compile_only_env if self.platform.compiles else {}
        return {"compile_only": [[k, v] for k, v in env.items()]} if env else {}

    def group_json(self) -> dict[str, Any]:
        """Its serving group as the host's programs read it (the group's name, hash and hosts,
        this host's rank): a group's converge starts and gates its ranks together."""
        g = self.group
        assert g is not None
        return {"name": g.name, "rank": g.rank, "sha": g.sha, "hosts": list(g.hosts)}
