"""Deploy data: every key, written once, and a host's data validated into :class:`Settings`.

Each field of :class:`Settings` is one data key: its name, type, check (:mod:`servefleet.settings.checks`),
default and one-line meaning (``key(check, default, doc)``), in the order the data table in docs/data.md
lists them (``python -m servefleet.fleet.datadoc``). Override a key per group
(``group_data/<group>.py``), per host (inventory host tuples) or per run (``pyinfra ... --data
serve_target=Throughput``). Secrets are never data: data names the environment variables that
hold them.

Pure Python (no pyinfra import): the deploy files call :func:`settings_from` on ``host.data`` at
the top, before any operation is added; a key the host has no data for takes its default here,
the one place defaults are applied. The data is validated whole, one check per key in the table's
order, then across keys; the first bad key stops the run with one line ``<key>: <value> <what is
wrong>; allowed: <what is>`` and no host changes.
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from servefleet.base import flags
from servefleet.base.errors import DataError, RecipeError
from servefleet.kinds import kind_of
from servefleet.kinds.rbln import defaults as rbln
from servefleet.remote.layout import RUNFILE_DIR, SECRETS_DIR
from servefleet.settings import checks as c
from servefleet.settings.checks import Check, Index, canonical_name

__all__ = [
    "DEFAULTS",
    "KEYS",
    "PREFIXES",
    "Index",
    "Settings",
    "canonical_name",
    "default_settings",
    "load_defaults",
    "settings_from",
]

# A data key is a name with one of these prefixes, one per area
PREFIXES = ("driver_", "sdk_", "pip_", "creds_", "serve_", "models_")


@dataclass(frozen=True)
class _Trusted:
    """A check that depends on ``pip_trusted_hosts`` (http is allowed on those hosts only)."""

    make: Callable[[frozenset[str] | None], Check]


def key(check: Check | _Trusted, default: Any, doc: str) -> Any:
    """One data key of :class:`Settings`: its check, its default (as data gives it) and its
    one-line meaning. The field itself holds the checked value."""
    return field(metadata={"check": check, "default": default, "doc": doc})


def _url(optional: bool = True, placeholder: str = "") -> _Trusted:
    def make(trusted: frozenset[str] | None) -> Check:
        check = c.url_check(trusted, placeholder)
        return c.optional(check) if optional else check

    return _Trusted(make)


def _controller_dir(optional: bool = False) -> Check:
    check = c.one_line("a controller directory", "a directory path on the controller")
    return c.optional(check) if optional else check


_env_name = c.matching(c.ENV_NAME, "an environment variable name", "[A-Za-z_][A-Za-z0-9_]*")
_sha256 = c.matching(c.SHA256, "a sha256", "64 lowercase hex digits")
_model = c.matching(c.MODEL_ID, "a model id", c.MODELS_ALLOWED)
_installer_arg = c.one_line("an argument", "arguments without control characters", empty=True)
_deb_package = c.matching(c.DEB_PACKAGE, "a Debian package name", c.DEB_PACKAGE_ALLOWED)
_gpu = c.matching(c.SLUG, "a GPU id", "a GPU id of vLLM's taxonomy (h200, b200, mi300x, ...)")
_revision = c.matching(c.REVISION, "a commit", "40 lowercase hex digits")
_host_name = c.one_line("an inventory host name", "a host name of the inventory")


@dataclass(frozen=True)
class Settings:
    """Validated deploy data for one host: one field per data key (see each key's meaning)."""

    # --- driver: the RBLN kernel driver (KMD), from Rebellions' runfile (RBLN Portal download)
    driver_version: str = key(
        c.pep440_version,
        "3.5.1",
        "wanted driver version, as `rbln-smi -j` reports it (KMD_version)",
    )
    driver_runfile_url: str | None = key(
        _url(placeholder="{version}"),
        None,
        "URL of rebellions-x86_64-{version}.run ({version} is filled in)",
    )
    driver_sha256: dict[str, str] = key(
        c.entries(c.pep440_version, _sha256, "driver version -> sha256 of its runfile"),
        {},
        "driver version -> sha256 of its runfile; a runfile that differs is refused",
    )
    driver_installer_args: tuple[str, ...] = key(
        c.listed(_installer_arg, "a list of arguments without control characters"),
        ["--silent"],
        "arguments for the runfile: unattended install",
    )
    driver_apt_packages: tuple[str, ...] = key(
        c.listed(_deb_package, c.DEB_PACKAGE_ALLOWED),
        ["dkms", "linux-headers-{kernel}"],
        "prerequisites; {kernel} = `uname -r`",
    )
    driver_apt_repo: dict[str, str] | None = key(
        c.optional(c.apt_repo),
        None,
        'extra apt source for them: {"src": "deb [signed-by=KEYRING] URL SUITE", "key": local key file}',
    )

    # --- sdk: the serving stack (RBLN: the SDK, rbln.md §0; GPU hosts: upstream vLLM)
    sdk_pins: dict[str, str] = key(
        c.sdk_pins, rbln.SDK_PINS, "exact pins of every SDK package; only `==` is accepted"
    )
    sdk_extra_packages: dict[str, tuple[str, ...]] = key(
        c.entries(
            c.package_name, c.listed(c.package_name, c.PACKAGES_ALLOWED), "extra -> package names"
        ),
        rbln.SDK_EXTRA_PACKAGES,
        "vllm-rbln extra -> what it brings (installed only when the selection needs it)",
    )
    sdk_python: str = key(c.command, "python3", "interpreter the release venvs are made with")
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
        c.python_specifier,
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
        _Trusted(lambda trusted: c.indexes(c.url_check(trusted))),
        rbln.PIP_INDEXES,
        "index -> url, the packages it owns, the glibc its wheels need; each package comes only from its owner",
    )
    pip_public_index: str | None = key(
        _url(), None, "index for every other package; None = the host's own pip configuration"
    )
    pip_trusted_hosts: tuple[str, ...] = key(
        c.trusted_hosts,
        [],
        "hosts reached over plain http (pip, driver runfile, model store): the lab's servers",
    )

    # --- creds: names of the controller's environment variables holding secrets (never the values)
    creds_index_user_env: str = key(
        _env_name, "RBLN_INDEX_USER", 'user name for indexes with "auth": True'
    )
    creds_index_password_env: str = key(
        _env_name, "RBLN_INDEX_PASSWORD", 'password for indexes with "auth": True'
    )
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
        "rbln/gpt-oss-120b",
        "recipe name under recipes/ or a path to a recipe file",
    )
    serve_strategy: str | None = key(
        c.optional(c.matching(c.SLUG, "a strategy slug", "a slug of [a-z0-9_-]")),
        None,
        "strategy slug; None = the recipe's first",
    )
    serve_target: str = key(c.serve_target, "Latency", "Latency or Throughput")
    serve_selection: dict[str, str] = key(
        c.selection, {}, "axis -> value, over the defaults (like `servefleet resolve --set`)"
    )
    serve_recommended: bool = key(
        c.flag, False, "start from the recipe's recommended selection instead of its base"
    )
    serve_base_port: int = key(
        c.whole(1, c.MAX_PORT), 8000, "instance i listens on serve_base_port + i"
    )
    serve_host: str | None = key(
        c.optional(c.host_name),
        None,
        "address the servers listen on (`--host`) and the gate asks; None = every address",
    )
    serve_shutdown_timeout: int = key(
        c.whole(0, 3600),
        60,
        "seconds a stopping server finishes in-flight requests (`--shutdown-timeout`; 0 aborts)",
    )
    serve_extra_args: tuple[str, ...] = key(
        c.extra_args,
        [],
        "more `vllm serve` flags for each server, checked by the platform's flag table (a recompile)",
    )
    serve_extra_env: dict[str, str] = key(
        c.extra_env, {}, "more variables for each server (a `VLLM_*` one must be vLLM's)"
    )
    serve_override_args: tuple[str, ...] = key(
        c.override_names,
        [],
        "flags (`--name`) and variables of the two above that replace the recipe's own",
    )
    serve_files: dict[str, str] = key(
        c.serve_files,
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
    serve_user: str = key(c.user_name, "servefleet", "system user the servers run as")
    serve_root: str = key(
        c.directory,
        "/opt/servefleet",
        "releases/<id> (one venv each), current -> the serving release",
    )
    serve_home: str = key(
        c.serve_tree,
        "/var/lib/servefleet",
        "HOME of serve_user (a directory of its own below /var/lib, /var/cache, /srv, /opt or "
        "/home; made by servefleet, or the serve user's already)",
    )
    serve_cache_root: str = key(
        c.serve_tree,
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
    serve_hardware: str | None = key(
        c.optional(_gpu),
        None,
        "vLLM recipes: the hosts' GPU id (h200, mi300x, ...); None = the default",
    )
    serve_variant: str | None = key(
        c.optional(c.matching(c.SLUG, "a variant", "a variant name of the recipe")),
        None,
        "vLLM recipes: variant (default, fp8, ...); None = the recipe's choice",
    )
    serve_features: dict[str, str] = key(
        c.features,
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
            c.matching(c.PD_ROLE, "a role", "prefill or decode"),
            c.matching(c.SLUG, "an inventory group", "a group name of [a-z0-9_-]"),
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
    serve_router: str = key(
        c.router,
        "none",
        "vllm-router in front: none; host: one per host over its instances; fleet: one on each "
        "host of serve_router_group over every instance of the run's other hosts",
    )
    serve_router_group: str = key(
        c.matching(c.SLUG, "an inventory group", "a group name of [a-z0-9_-]"),
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
        c.pep440_version, "0.1.17", "vllm-router version, its own release from the public index"
    )
    serve_router_user: str = key(c.user_name, "servefleet-router", "system user the router runs as")
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

    # --- models: weights fetched before serving; servers run with HF_HUB_OFFLINE=1
    models_hf_home: str = key(
        c.serve_tree,
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
        c.entries(_model, _revision, c.MODELS_ALLOWED),
        {},
        "model id -> 40-hex commit it is pinned to; none = the hub's main / the store's manifest",
    )
    models_sha256: dict[str, str] = key(
        c.entries(_model, _sha256, c.MODELS_ALLOWED),
        {},
        "model id -> sha256 of its store archive; none = the store's manifest",
    )
    models_lock_timeout: int = key(
        c.whole(1, 86400),
        600,
        "seconds a fetch waits for the lock on $HF_HOME/hub (one fetch at a time; the serve user "
        "can hold it too) before it fails",
    )

    # The secrets the creds_* keys name, read from the controller's environment (never data)
    index_user: str | None = field(default=None, repr=False)
    index_password: str | None = field(default=None, repr=False)
    hf_token: str | None = field(default=None, repr=False)
    api_key: str | None = field(default=None, repr=False)
    router_admin_key: str | None = field(default=None, repr=False)

    def owner_of(self, package: str) -> Index | None:
        """The index that owns ``package``, or None for the public index."""
        name = canonical_name(package)
        return next((i for i in self.pip_indexes if name in i.packages), None)


KEYS = tuple(f.name for f in fields(Settings) if "check" in f.metadata)  # every data key, in order
DEFAULTS: dict[str, Any] = {
    f.name: f.metadata["default"] for f in fields(Settings) if f.name in KEYS
}
DOCS: dict[str, str] = {f.name: f.metadata["doc"] for f in fields(Settings) if f.name in KEYS}


def load_defaults() -> dict[str, Any]:
    """Every data key with its default (a copy of :data:`DEFAULTS`)."""
    return copy.deepcopy(DEFAULTS)


def _checks(trusted: frozenset[str] | None) -> dict[str, Check]:
    """One check per data key, in the table's order; http is allowed on ``trusted``."""
    out = {}
    for f in fields(Settings):
        check = f.metadata.get("check")
        if check is not None:
            out[f.name] = check.make(trusted) if isinstance(check, _Trusted) else check
    return out


# ---------------------------------------------------------------------------------------------
# Across keys: run right after the later key of each pair, so the first bad key is reported


def _kind_defaults(recipe: Any) -> Mapping[str, Any]:
    """The defaults of the kind of the recipe data names, over the table's; none for a recipe
    that is not found (serve_recipe's own check says what is wrong with it)."""
    try:
        return kind_of(recipe).defaults if isinstance(recipe, str) else {}
    except RecipeError:
        return {}


def _kind_pinned(pins: dict[str, str], recipe: Any) -> None:
    """The recipe's kind needs its packages pinned (RBLN: rebel-compiler and vllm-rbln; GPU:
    vllm). A recipe that is not a name of one is left to serve_recipe's own check."""
    try:
        required = kind_of(recipe).required_pins() if isinstance(recipe, str) else ()
    except RecipeError:
        return
    for name in required:
        if name not in pins:
            raise DataError(
                f"sdk_pins: {name} must be pinned; allowed: a list that pins {', '.join(required)}"
            )


def _all_pinned(values: dict[str, Any], owners: dict[str, tuple[str, ...]]) -> None:
    pins = values["sdk_pins"]
    for where, packages in owners.items():
        for package in packages:
            if package not in pins:
                raise DataError(
                    f"{where}: {package} has no pin in sdk_pins; "
                    f"allowed: one of {', '.join(sorted(pins))}"
                )


def _extras_pinned(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    extras = values["sdk_extra_packages"].items()
    _all_pinned(values, {f"sdk_extra_packages.{name}": packages for name, packages in extras})


def _indexes_pinned(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    _all_pinned(values, {f"pip_indexes.{i.name}": i.packages for i in values["pip_indexes"]})


def _wheelhouse(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    if values["sdk_source"] != "wheelhouse":
        return
    unset = [key for key in ("sdk_lock", "sdk_wheelhouse") if not values[key]]
    if unset:
        raise DataError(
            f"sdk_source: 'wheelhouse' needs {' and '.join(unset)} set; allowed: index, or "
            "wheelhouse with sdk_lock (`servefleet lock`) and sdk_wheelhouse (`servefleet "
            "wheelhouse DIR`)"
        )


def netrc_bare(value: str) -> bool:
    """Whether ``value`` is a token every netrc reader reads alike when written bare: printable
    ASCII without whitespace, quotes or backslashes (Python 3.10's lexer keeps quotes as part of
    a word, 3.11's unquotes and unescapes, uv has its own)."""
    return all("!" <= ch <= "~" and ch not in "\"'\\" for ch in value)


def _credentials(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    if values["sdk_source"] == "wheelhouse":  # hosts reach no index; `servefleet wheelhouse` did
        return
    for index in values["pip_indexes"]:
        if index.auth:
            for key in ("creds_index_user_env", "creds_index_password_env"):
                if not environ.get(values[key]):
                    raise DataError(
                        f"{key}: environment variable {values[key]} is not set "
                        f"(needed for the {index.name} index)"
                    )
                if not netrc_bare(environ[values[key]]):  # the value itself is never shown
                    raise DataError(
                        f"{key}: the value of {values[key]} holds whitespace, a quote, a "
                        "backslash or a non-ASCII character, which the hosts' netrc cannot carry "
                        "alike for every reader; allowed: printable ASCII without whitespace, "
                        "quotes or backslashes"
                    )


def _extras_known(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    """serve_extra_args, serve_extra_env and serve_override_args against the flag table of the
    recipe's platform (whether the recipe sets them already is known once it is resolved)."""
    try:
        platform = kind_of(values["serve_recipe"]).name
    except RecipeError:  # serve_recipe's own error, where the recipe is resolved
        return
    table = flags.table_for(platform)
    flags.extra_units("serve_extra_args", values["serve_extra_args"], table)
    flags.check_env("serve_extra_env", values["serve_extra_env"], table)
    flags.override_dests("serve_override_args", values["serve_override_args"], table)


def _api_key(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    name = values["creds_api_key_env"]
    key_ = environ.get(name)
    if key_ and not c.API_KEY.fullmatch(key_):
        raise DataError(
            f"creds_api_key_env: the value of {name} (not shown) is not an API key servefleet "
            f"passes on; allowed: {c.API_KEY_ALLOWED}"
        )


# The serve user owns these trees (its servers write there) ...
SERVE_TREES = ("serve_home", "serve_cache_root", "models_hf_home")
# ... and root alone writes these: none may be equal to or inside another's (#18 finding 4).
ROOT_TREES = {"serve_root": None, "the secrets directory": SECRETS_DIR,
              "the driver runfiles": RUNFILE_DIR}  # fmt: skip


def _inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _trees_apart(values: dict[str, Any]) -> None:
    """No root-managed tree equal to or inside a serve-user tree, nor the reverse: the serve user
    could otherwise replace what root runs (``serve_root/lib``) or plant links where root writes."""
    for serve_key in SERVE_TREES:
        serve = values[serve_key]
        for name, fixed in ROOT_TREES.items():
            root = fixed or values[name]
            if _inside(root, serve) or _inside(serve, root):
                raise DataError(
                    f"{serve_key}: {serve!r} (the serve user's) and {name} {root!r} (root's) "
                    "overlap, one inside the other; allowed: separate trees (the defaults: "
                    f"{serve_key} {DEFAULTS[serve_key]!r}, serve_root {DEFAULTS['serve_root']!r})"
                )


# the router's ports: the proxy's (clients, and the fleet's hosts), its metrics, vllm-router's own
ROUTER_PORTS = ("serve_router_port", "serve_router_metrics_port", "serve_router_backend_port",
                "serve_router_admin_port")  # fmt: skip


def _router(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    if values["serve_router_user"] == values["serve_user"]:
        raise DataError(
            f"serve_router_user: {values['serve_router_user']!r} is serve_user too; allowed: a "
            "user of its own (the servers run model code; the router must not be theirs)"
        )
    seen: dict[int, str] = {}
    for name in ROUTER_PORTS:
        port = values[name]
        if port in seen:
            raise DataError(
                f"{name}: {port} is {seen[port]} too; allowed: another port (the router's "
                f"ports {', '.join(ROUTER_PORTS)} are each its own)"
            )
        seen[port] = name
    name = values["creds_router_admin_key_env"]
    key_ = environ.get(name)
    if key_ and not c.API_KEY.fullmatch(key_):
        raise DataError(
            f"creds_router_admin_key_env: the value of {name} (not shown) is not a key "
            f"servefleet passes on; allowed: {c.API_KEY_ALLOWED}"
        )


def serve_file(root_given: str, argv: str, source: str) -> str:
    """The real path of a serve_files file, when it is in serve_files_root, resolved (no link
    out of it): the deploy ships it 0644 into the release, where the serve user reads it (#31
    finding 8). Checked with the data, and again where the file is read.

    + root_given: serve_files_root as the data gives it
    + argv: the serve_files key (for the message)
    + source: the controller path
    """
    root = os.path.realpath(os.path.expanduser(root_given))
    real = os.path.realpath(source)
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        link = f" (a link to {real!r})" if real != os.path.abspath(source) else ""
        raise DataError(
            f"serve_files.{argv}: {source!r}{link} is outside serve_files_root {root_given!r}; "
            "allowed: a readable regular file in serve_files_root (the fleet repository by "
            "default), not through a link out of it"
        )
    return real


def _files_inside(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    for argv, source in values["serve_files"].items():
        serve_file(values["serve_files_root"], argv, source)


_ACROSS: dict[str, Callable[[dict[str, Any], Mapping[str, str]], None]] = {
    "serve_files_root": _files_inside,
    "serve_router_breaker_failures": _router,
    "sdk_extra_packages": _extras_pinned,
    "sdk_wheelhouse": _wheelhouse,
    "pip_indexes": _indexes_pinned,
    "creds_index_password_env": _credentials,
    "creds_api_key_env": _api_key,
    "serve_override_args": _extras_known,
}


def _misspelt(key: str) -> bool:
    """A key without our prefixes that is one slip from one of ours (``sevre_target``): pyinfra's
    own keys (``ssh_user``, ``_sudo``) are nowhere near one."""
    return difflib.get_close_matches(key, KEYS, n=1, cutoff=0.85) != []


def _refuse_unknown(keys: Iterable[str]) -> None:
    ours = [k for k in keys if isinstance(k, str) and (k.startswith(PREFIXES) or _misspelt(k))]
    for key in sorted(ours):
        if key not in KEYS:
            close = c.closest(key, KEYS, cutoff=0.7)  # keys share long prefixes
            hint = (
                f"did you mean {close}?"
                if close
                else "allowed: the keys of servefleet/settings/table.py"
            )
            raise DataError(f"{key if key.isprintable() else repr(key)}: unknown data key; {hint}")


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
    have = None if keys is None else set(keys)
    if have is not None:
        _refuse_unknown(have)

    kind_defaults = _kind_defaults(
        get("serve_recipe") if have is None or "serve_recipe" in have else DEFAULTS["serve_recipe"]
    )

    def read(key: str) -> Any:
        if have is None or key in have:
            return get(key)
        return copy.deepcopy(kind_defaults.get(key, DEFAULTS[key]))

    values: dict[str, Any] = {}
    for key, check in _checks(c.trusted_of(read("pip_trusted_hosts"))).items():
        try:
            values[key] = check(read(key))
        except c.Refused as e:
            raise e.error(key) from None
        if key == "sdk_pins":
            _kind_pinned(values[key], read("serve_recipe"))
        if key in _ACROSS:
            _ACROSS[key](values, environ)
    _trees_apart(values)

    def secret(key: str) -> str | None:
        return environ.get(values[key]) or None

    return Settings(
        **values,
        index_user=secret("creds_index_user_env"),
        index_password=secret("creds_index_password_env"),
        hf_token=secret("creds_hf_token_env"),
        api_key=secret("creds_api_key_env"),
        router_admin_key=secret("creds_router_admin_key_env"),
    )


def default_settings(recipe: str | None = None, compiler_version: str | None = None) -> Settings:
    """The deploy's settings from the default data (``serve_recipe`` and the rebel-compiler pin
    replaced when given). Credentials are not read: nothing rendered from these holds them.

    + recipe: the recipe to serve instead of the default's
    + compiler_version: the rebel-compiler version to pin instead of the default's
    """
    data = load_defaults()
    if recipe:
        data["serve_recipe"] = recipe
    if compiler_version:
        data["sdk_pins"] = [
            f"rebel-compiler=={compiler_version}" if p.startswith("rebel-compiler==") else p
            for p in data["sdk_pins"]
        ]
    unused = {data[key]: "-" for key in ("creds_index_user_env", "creds_index_password_env")}
    return settings_from(data.get, unused)
