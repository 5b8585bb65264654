"""Deploy data: every key, written once, and a host's data validated into :class:`Settings`.

Each field of :class:`Settings` is one data key: its name, type, check (one of
:mod:`servefleet.settings.checks` and the ``check_*`` modules beside it), default and one-line
meaning (``key(check, default, doc)``), in the order the data table in docs/data.md lists them
(``python -m servefleet.fleet.datadoc``). Override a key per group (``group_data/<group>.py``),
per host (inventory host tuples) or per run (``pyinfra ... --data serve_target=Throughput``).
Secrets are never data: data names the environment variables that hold them.

The table's defaults are platform-neutral: a key a platform decides (its driver, its stack and
the indexes that own it, their credentials' variables, the default recipe) is :data:`KIND` here,
and a host's default for it is its recipe's kind's (``Kind.defaults``, shipped in the kind's
package; the default kind's, :func:`servefleet.kinds.default_kind`, for a key its own kind does
not set and for a host whose data names no recipe).

Pure Python (no pyinfra import): the deploy files call :func:`settings_from` on ``host.data`` at
the top, before any operation is added; a key the host has no data for takes its default here,
the one place defaults are applied. The data is validated whole, one check per key in the table's
order, then across keys (:mod:`servefleet.settings.across`); the first bad key stops the run with
one line ``<key>: <value> <what is wrong>; allowed: <what is>`` and no host changes. How a key is
declared and how the data is read against the table is :mod:`servefleet.settings.keys`; this
module is the table, and binds that reading to it (:data:`KEYS`, :data:`DEFAULTS`,
:func:`settings_from`).
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servefleet.base.remote import layout
from servefleet.kinds import kind_of, roles
from servefleet.settings import (
    check_analysis as analysis,
    check_names as names,
    check_net as net,
    check_paths as paths,
    check_words as words,
    checks as c,
)
from servefleet.settings.check_names import Index, canonical_name
from servefleet.settings.checks import Check
from servefleet.settings.keys import (
    KIND,
    PREFIXES,
    Trusted,
    changed,
    defaults_of,
    docs_of,
    key,
    keys_of,
    validated,
)

__all__ = [
    "DEFAULTS",
    "DOCS",
    "KEYS",
    "KIND",
    "PREFIXES",
    "Settings",
    "default_settings",
    "load_defaults",
    "settings_from",
]


def _url(optional: bool = True, placeholder: str = "") -> Trusted:
    def make(trusted: frozenset[str] | None) -> Check:
        check = net.url_check(trusted, placeholder)
        return c.optional(check) if optional else check

    return Trusted(make)


def _controller_dir(optional: bool = False) -> Check:
    check = c.one_line("a controller directory", "a directory path on the controller")
    return c.optional(check) if optional else check


_env_name = c.matching(words.ENV_NAME, "an environment variable name", layout.ENV_NAME_ALLOWED)
_sha256 = c.matching(names.SHA256, "a sha256", "64 lowercase hex digits")
_model = c.matching(names.MODEL_ID, "a model id", names.MODELS_ALLOWED)
_installer_arg = c.one_line("an argument", "arguments without control characters", empty=True)
_deb_package = c.matching(names.DEB_PACKAGE, "a Debian package name", names.DEB_PACKAGE_ALLOWED)
_gpu = c.matching(names.SLUG, "a GPU id", "a GPU id of vLLM's taxonomy (h200, b200, mi300x, ...)")
_revision = c.matching(names.REVISION, "a commit", "40 lowercase hex digits")
_host_name = c.one_line("an inventory host name", "a host name of the inventory")
_url_path = c.matching(
    re.compile(r"(?!.*//)(?!.*/\.\.?(/|\Z))/[A-Za-z0-9._~/-]*\Z"),
    "an HTTP path",
    "a path of [A-Za-z0-9._~/-] starting with '/', without '//', '/.' or '/..' segments",
)
# monitoring_thresholds: each field's check and default (the rules' thresholds)
_MONITORING = {"ttft_p95_ms": c.whole(1, 3_600_000), "queue_p95_ms": c.whole(1, 3_600_000),
               "kv_cache_percent": c.whole(1, 100), "for_seconds": c.whole(0, 86400),
               "status_max_age_seconds": c.whole(60, 604800)}  # fmt: skip
MONITORING = {"ttft_p95_ms": 2000, "queue_p95_ms": 5000, "kv_cache_percent": 90, "for_seconds": 120,
              "status_max_age_seconds": 1800}  # fmt: skip


def _over(defaults: Mapping[str, Any], check: Check) -> Check:
    """A mapping checked by ``check``, over ``defaults`` (a field it lacks keeps its default)."""
    return lambda value: {**defaults, **check(value)}


@dataclass(frozen=True)
class Settings:
    """Validated deploy data for one host: one field per data key (see each key's meaning)."""

    # --- driver: the platform's kernel driver, when servefleet installs it (RBLN: the KMD, from
    # Rebellions' runfile, an RBLN Portal download)
    driver_version: str = key(
        names.pep440_version,
        KIND,
        "wanted driver version, as `rbln-smi -j` reports it (KMD_version)",
    )
    driver_runfile_url: str | None = key(
        _url(placeholder="{version}"),
        None,
        "URL of rebellions-x86_64-{version}.run ({version} is filled in)",
    )
    driver_sha256: dict[str, str] = key(
        c.entries(names.pep440_version, _sha256, "driver version -> sha256 of its runfile"),
        {},
        "driver version -> sha256 of its runfile; a runfile that differs is refused",
    )
    driver_installer_args: tuple[str, ...] = key(
        c.listed(_installer_arg, "a list of arguments without control characters"),
        KIND,
        "arguments for the runfile: unattended install",
    )
    driver_apt_packages: tuple[str, ...] = key(
        c.listed(_deb_package, names.DEB_PACKAGE_ALLOWED),
        KIND,
        "prerequisites; {kernel} = `uname -r`",
    )
    driver_apt_repo: dict[str, str] | None = key(
        c.optional(net.apt_repo),
        None,
        'extra apt source for them: {"src": "deb [signed-by=KEYRING] URL SUITE", "key": local key file}',
    )

    # --- sdk: the serving stack (RBLN: the SDK, rbln.md §0; GPU hosts: upstream vLLM)
    sdk_pins: dict[str, str] = key(
        names.sdk_pins,
        KIND,
        "exact pins of every SDK package; only `==` is accepted",
        given="list[str]",
    )
    sdk_extra_packages: dict[str, tuple[str, ...]] = key(
        c.entries(
            names.package_name,
            c.listed(names.package_name, names.PACKAGES_ALLOWED),
            "extra -> package names",
        ),
        KIND,
        "vllm-rbln extra -> what it brings (installed only when the selection needs it)",
    )
    sdk_python: str = key(paths.command, "python3", "interpreter the release venvs are made with")
    sdk_installer: str = key(
        c.installer,
        "uv",
        "uv (each host takes it from uv's wheel, by hash: public index or wheelhouse) or pip",
    )
    sdk_lock: str | None = key(
        _controller_dir(optional=True),
        None,
        "lock directory `servefleet lock` writes (locks/prod); None = unlocked releases",
    )
    sdk_lock_python: str = key(
        names.python_specifier,
        ">=3.10",
        "Python versions a lock resolves for (the hosts' sdk_python among them)",
    )
    sdk_wheel_cache: str = key(
        _controller_dir(),
        "~/.cache/servefleet/wheels",
        "wheels built once from sdists; hosts never build",
    )
    sdk_source: str = key(
        c.package_source,
        "index",
        "index: hosts fetch packages, models, driver themselves; wheelhouse: copied from sdk_wheelhouse (needs sdk_lock)",
    )
    sdk_wheelhouse: str | None = key(
        _controller_dir(optional=True),
        None,
        'controller directory `servefleet wheelhouse DIR` filled from the lock (sdk_source = "wheelhouse")',
    )

    # --- pip: where packages come from
    pip_indexes: tuple[Index, ...] = key(
        Trusted(lambda trusted: names.indexes(net.url_check(trusted))),
        KIND,
        "index -> url, the packages it owns, the glibc its wheels need; each package comes only from its owner",
        given="dict[str, dict]",
    )
    pip_public_index: str | None = key(
        _url(), None, "index for every other package; None = the host's own pip configuration"
    )
    pip_trusted_hosts: tuple[str, ...] = key(
        net.trusted_hosts,
        [],
        "hosts reached over plain http (pip, driver runfile, model store): the lab's servers",
    )

    # --- creds: names of the controller's environment variables holding secrets (never the values)
    creds_index_user_env: str = key(_env_name, KIND, 'user name for indexes with "auth": True')
    creds_index_password_env: str = key(_env_name, KIND, 'password for indexes with "auth": True')
    creds_hf_token_env: str = key(
        _env_name, "HF_TOKEN", "Hugging Face token for gated models (optional)"
    )
    creds_api_key_env: str = key(
        _env_name,
        "SERVEFLEET_API_KEY",
        "API key the servers require on /v1 (VLLM_API_KEY from a 0600 root file); unset: open",
    )
    creds_router_admin_key_env: str = key(
        _env_name,
        "SERVEFLEET_ROUTER_ADMIN_KEY",
        "serve_router fleet: key the fleet's hosts take instances out of the routers' rotation "
        "with (their worker API); required there",
    )

    # --- serve: what to serve, and where it lives on the host
    serve_recipe: str = key(
        c.one_line("a recipe", "a recipe name (rbln/<name>) or a recipe file path"),
        KIND,
        "recipe name under recipes/ or a path to a recipe file",
    )
    serve_strategy: str | None = key(
        c.optional(c.matching(names.SLUG, "a strategy slug", "a slug of [a-z0-9_-]")),
        None,
        "strategy slug; None = the recipe's first",
    )
    serve_target: str = key(c.serve_target, "Latency", "Latency or Throughput")
    serve_selection: dict[str, str] = key(
        words.selection, {}, "axis -> value, over the defaults (like `servefleet resolve --set`)"
    )
    serve_recommended: bool = key(
        c.flag, False, "start from the recipe's recommended selection instead of its base"
    )
    serve_base_port: int = key(
        c.whole(1, c.MAX_PORT), 8000, "instance i listens on serve_base_port + i"
    )
    serve_host: str | None = key(
        c.optional(net.host_name),
        None,
        "address the servers listen on (`--host`) and the gate asks; None = loopback behind "
        "the host's router (serve_router 'host'), else every address",
    )
    serve_open_paths: tuple[str, ...] = key(
        c.listed(_url_path, "a list of HTTP paths"),
        ["/v1/", "/health", "/metrics", "/version"],
        "the only paths a server answers (one ending in '/': every path under it); any other is "
        "404 before vLLM sees it (its API key guards /v1/ only: /invocations runs inference)",
    )
    serve_shutdown_timeout: int = key(
        c.whole(0, 3600),
        60,
        "seconds a stopping server finishes in-flight requests (`--shutdown-timeout`; 0 aborts)",
    )
    serve_extra_args: tuple[str, ...] = key(
        words.extra_args,
        [],
        "more `vllm serve` flags for each server, checked by the platform's flag table (a recompile)",
    )
    serve_extra_env: dict[str, str] = key(
        words.extra_env, {}, "more variables for each server (a `VLLM_*` one must be vLLM's)"
    )
    serve_override_args: tuple[str, ...] = key(
        words.override_names,
        [],
        "flags (`--name`) and variables of the two above that replace the recipe's own",
    )
    serve_files: dict[str, str] = key(
        paths.serve_files,
        {},
        "files a command line names (a chat template, a plugin) -> the controller's file, shipped "
        "with the release (its sha256 in the release id) and named in argv by the shipped path",
    )
    serve_files_root: str = key(
        _controller_dir(),
        ".",
        "the controller directory serve_files' files must be in, never through a link out of it "
        "('.': the fleet repository, where the fleet commands run)",
    )
    serve_user: str = key(names.user_name, "servefleet", "system user the servers run as")
    serve_root: str = key(
        paths.directory,
        "/opt/servefleet",
        "releases/<id> (one venv each), current -> the serving release",
    )
    serve_home: str = key(
        paths.serve_tree,
        "/var/lib/servefleet",
        "HOME of serve_user (a directory of its own below /var/lib, /var/cache, /srv, /opt or "
        "/home; made by servefleet, or the serve user's already)",
    )
    serve_cache_root: str = key(
        paths.serve_tree,
        "/var/cache/servefleet/vllm",
        "VLLM_CACHE_ROOT, shared by every release (a directory of its own below /var/lib, "
        "/var/cache, /srv, /opt or /home; made by servefleet, or the serve user's already)",
    )
    serve_prewarm_timeout: int = key(
        c.whole(1), 14400, "seconds a cold first start (it compiles) may take to get healthy"
    )
    serve_health_timeout: int = key(
        c.whole(1), 300, "seconds a warm (re)start may take to answer /health and a chat"
    )
    serve_verify: bool = key(
        c.flag, False, "the probe reads every file of the releases and checks its sha256 (slow)"
    )
    serve_hardware: str | None = key(
        c.optional(_gpu),
        None,
        "vLLM recipes: the hosts' GPU id (h200, mi300x, ...); None = the default",
    )
    serve_variant: str | None = key(
        c.optional(c.matching(names.SLUG, "a variant", "a variant name of the recipe")),
        None,
        "vLLM recipes: variant (default, fp8, ...); None = the recipe's choice",
    )
    serve_features: dict[str, str] = key(
        words.features,
        {},
        "vLLM recipes: feature -> on, off or a mode (opt-in features are off unless named)",
    )
    serve_instances: int | None = key(
        c.optional(c.whole(1, 64)),
        None,
        "servers per host; None = RBLN: as many as the NPUs hold, GPU: one",
    )
    serve_load_timeout: int = key(
        c.whole(1), 1800, "GPU: seconds a start may take to load the model and capture CUDA graphs"
    )
    serve_prewarm_scope: str = key(
        c.prewarm_scope, "host", "host: each host compiles; fleet: one compiles, the rest copy it"
    )
    serve_prewarm_host: str | None = key(
        c.optional(_host_name),
        None,
        "fleet scope: a host without NPUs that compiles (compile only) instead",
    )
    serve_prewarm_store: str = key(
        _controller_dir(),
        "~/.cache/servefleet/prewarm",
        "fleet scope: the copies, on the controller",
    )

    serve_roles: dict[str, str] = key(
        c.entries(
            c.matching(names.PD_ROLE, "a role", "prefill or decode"),
            c.matching(names.SLUG, "an inventory group", "a group name of [a-z0-9_-]"),
            "prefill or decode -> an inventory group",
        ),
        {},
        "a prefill/decode selection: the group whose hosts serve each role (behind a fleet "
        "router); none = both roles on each host, behind its own router",
    )
    serve_pd_pairs: int = key(
        c.whole(1, 32),
        1,
        "a prefill/decode selection: prefill servers on a host, and as many decode servers",
    )
    serve_group: str | None = key(
        c.optional(c.matching(names.SLUG, "a serving group", "a group name of [a-z0-9_-]")),
        None,
        "a multi-node strategy: the hosts giving the same name serve one model together",
    )
    serve_group_rank: int | None = key(
        c.optional(c.whole(0, 63)),
        None,
        "serve_group: this host's rank (0 serves the API); None = by inventory order",
    )
    serve_nodes: int | None = key(
        c.optional(c.whole(2, 16)),
        None,
        "a multi-node strategy: the hosts it spans; None = the fewest the recipe runs on",
    )
    serve_iface: str | None = key(
        c.optional(c.matching(roles.IFACE, "an interface", roles.IFACE_ALLOWED)),
        None,
        "serve_group: the NIC NCCL and Gloo use; None = the one carrying the host's address",
    )
    serve_router: str = key(
        c.router,
        "none",
        "vllm-router in front: none; host: one per host over its instances; fleet: one on each "
        "host of serve_router_group over every instance of the run's other hosts",
    )
    serve_router_group: str = key(
        c.matching(names.SLUG, "an inventory group", "a group name of [a-z0-9_-]"),
        "router",
        "serve_router fleet: the inventory group of the router hosts (they serve nothing)",
    )
    serve_router_port: int = key(
        c.whole(1, c.MAX_PORT), 8080, "port the router listens on (at serve_host)"
    )
    serve_router_metrics_port: int = key(
        c.whole(1, c.MAX_PORT), 29000, "port of the router's Prometheus metrics (at serve_host)"
    )
    serve_router_backend_port: int = key(
        c.whole(1, c.MAX_PORT),
        18080,
        "loopback port of vllm-router itself: clients reach only the OpenAI paths, through its "
        "proxy (nginx) at serve_router_port",
    )
    serve_router_admin_port: int = key(
        c.whole(1, c.MAX_PORT),
        8079,
        "serve_router fleet: port of the routers' worker API for the fleet's hosts (at "
        "serve_host, through the proxy, with the key of creds_router_admin_key_env)",
    )
    serve_router_version: str = key(
        names.pep440_version, "0.1.17", "vllm-router version, its own release from the public index"
    )
    serve_router_user: str = key(
        names.user_name, "servefleet-router", "system user the router runs as"
    )
    serve_router_policy: str = key(
        c.router_policy, "round_robin", "how the router picks an instance (`--policy`)"
    )
    serve_router_health_interval: int = key(
        c.whole(1, 3600), 5, "seconds between the router's /health checks of each instance"
    )
    serve_router_health_failures: int = key(
        c.whole(1, 100), 3, "failed checks in a row that take an instance out of rotation"
    )
    serve_router_health_successes: int = key(
        c.whole(1, 100), 2, "passed checks in a row that put it back"
    )
    serve_router_retries: int = key(
        c.whole(1, 20),
        5,
        "attempts a request gets, each on an instance the policy picks (1: no retry)",
    )
    serve_router_breaker_failures: int = key(
        c.whole(1, 1000),
        2,
        "failed requests in a row that take an instance out until the router's breaker retries it",
    )

    # --- rollout: `servefleet rollout --analysis` (the canary against a host not yet upgraded)
    rollout_analysis: dict[str, float] = key(
        analysis.rollout_analysis,
        analysis.ANALYSIS,
        "canary analysis, each field over its default: requests, concurrency, prompt_tokens, "
        "output_tokens, timeout and request_timeout (s); how much worse the canary may be "
        "(fractions) in ttft_p50/p95, itl_p50/p95, tokens_per_s, error_rate; the test's "
        "significance",
    )

    # --- models: weights fetched before serving; servers run with HF_HUB_OFFLINE=1
    models_hf_home: str = key(
        paths.serve_tree,
        "/var/lib/servefleet/hf",
        "HF_HOME of the servers (models in $HF_HOME/hub; a directory of its own below /var/lib, "
        "/var/cache, /srv, /opt or /home; made by servefleet, or the serve user's already)",
    )
    models_store_url: str | None = key(
        _url(), None, "None = the Hugging Face hub; else a store serving <org>/<name>.tar.gz"
    )
    models_hub_url: str | None = key(
        _url(), None, "the hub a fetch without a store uses (HF_ENDPOINT); None = the client's own"
    )
    models_revisions: dict[str, str] = key(
        c.entries(_model, _revision, names.MODELS_ALLOWED),
        {},
        "model id -> 40-hex commit it is pinned to; none = the hub's main / the store's manifest",
    )
    models_sha256: dict[str, str] = key(
        c.entries(_model, _sha256, names.MODELS_ALLOWED),
        {},
        "model id -> sha256 of its store archive; none = the store's manifest",
    )
    models_lock_timeout: int = key(
        c.whole(1, 86400),
        600,
        "seconds a fetch waits for the lock on $HF_HOME/hub (one fetch at a time; the serve user "
        "can hold it too) before it fails",
    )

    # --- monitoring: the Prometheus rules servefleet ships (`servefleet monitoring`, `init`)
    monitoring_thresholds: dict[str, int] = key(
        _over(MONITORING, c.record(_MONITORING, (), "a mapping of " + ", ".join(_MONITORING))),
        MONITORING,
        "alert thresholds of the shipped Prometheus rules, each over its default: TTFT p95 and "
        "queue time p95 (ms), KV-cache usage (%), how long a condition holds before it fires, "
        "the oldest status --textfile that is trusted (s)",
    )

    # The secrets the creds_* keys name, read from the controller's environment (never data)
    index_user: str | None = field(default=None, repr=False)
    index_password: str | None = field(default=None, repr=False)
    hf_token: str | None = field(default=None, repr=False)
    api_key: str | None = field(default=None, repr=False)
    router_admin_key: str | None = field(default=None, repr=False)
    # the keys the host's data sets (not its defaults): a platform decided by the probe checks
    # them again (:func:`servefleet.settings.across.unread_key`)
    given: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def owner_of(self, package: str) -> Index | None:
        """The index that owns ``package``, or None for the public index."""
        name = canonical_name(package)
        return next((i for i in self.pip_indexes if name in i.packages), None)

    # serve_router, read in one place: what the plan, the steps and the lock ask of it
    @property
    def router_off(self) -> bool:
        """No vllm-router (``serve_router = "none"``)."""
        return self.serve_router == "none"

    @property
    def router_per_host(self) -> bool:
        """One router on each host over its own instances (``"host"``)."""
        return self.serve_router == "host"

    @property
    def router_fleet(self) -> bool:
        """Routers on ``serve_router_group``'s hosts over the run's other hosts (``"fleet"``)."""
        return self.serve_router == "fleet"

    @property
    def instance_host(self) -> str | None:
        """Where the host's servers listen (their ``--host``), decided here only: ``serve_host``;
        else loopback behind the host's own router, so that only its proxy's port faces the
        network (vLLM guards not every route with ``--api-key``: #46); else None, every address
        (the clients, or a fleet router on another host, reach them at the host's address). The
        router reaches them there and the gate asks there (its default, None, is loopback)."""
        if self.serve_host:
            return self.serve_host
        return "127.0.0.1" if self.router_per_host else None


KEYS = keys_of(Settings)  # every data key, in order
# every key's default when the data names no recipe (the default kind's for a key it decides)
DEFAULTS: dict[str, Any] = defaults_of(Settings)
DOCS: dict[str, str] = docs_of(Settings)


def load_defaults() -> dict[str, Any]:
    """Every data key with its default (a copy of :data:`DEFAULTS`)."""
    return copy.deepcopy(DEFAULTS)


def settings_from(
    get: Callable[[str], Any],
    environ: Mapping[str, str] | None = None,
    keys: Iterable[str] | None = None,
) -> Settings:
    """Validate a host's data (``host.data.get``) whole into Settings; DataError names the key.

    + get: returns the value of a data key (None when unset)
    + environ: where credential variables are read from (default: this process's environment)
    + keys: every data key the host has (``host.data.dict().keys()``): ones with our prefixes
      that the defaults do not define are refused, and a key the host lacks takes its default,
      as inside the deploys (None: ``get`` answers for every key)
    """
    environ = os.environ if environ is None else environ
    keys = None if keys is None else list(keys)
    values = validated(Settings, DEFAULTS, get, environ, keys)

    def secret(key: str) -> str | None:
        return environ.get(values[key]) or None

    return Settings(
        **values,
        index_user=secret("creds_index_user_env"),
        index_password=secret("creds_index_password_env"),
        hf_token=secret("creds_hf_token_env"),
        api_key=secret("creds_api_key_env"),
        router_admin_key=secret("creds_router_admin_key_env"),
        given=frozenset() if keys is None else changed(Settings, DEFAULTS, values, keys),
    )


def default_settings(
    recipe: str | None = None, options: Mapping[str, Any] | None = None
) -> Settings:
    """The deploy's settings from the default data (every key set to :data:`DEFAULTS`), with
    ``serve_recipe`` replaced when given and what the recipe's kind reads of ``servefleet
    resolve``'s options (``Kind.unit_data``: RBLN's ``--compiler-version`` is the compiler
    pinned). Credentials are not read: nothing rendered from these holds them.

    + recipe: the recipe to serve instead of the default's
    + options: the resolve options given (their keywords), none by default
    """
    data = load_defaults()
    if recipe:
        data["serve_recipe"] = recipe
    if options:
        kind_of(data["serve_recipe"]).unit_data(options, data)
    unused = {data[key]: "-" for key in ("creds_index_user_env", "creds_index_password_env")}
    return settings_from(data.get, unused)
