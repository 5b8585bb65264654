"""The checks across data keys, each run right after the later key it reads (so the first bad
key is the one reported): the kind's packages pinned, every extra and index package pinned, the
wheelhouse source's keys, the index credentials (set, and what a netrc carries), the flag table
of the recipe's platform, the API keys, the router's user and ports, serve_files inside its
root, and the serve user's trees apart from root's. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from servefleet import platforms
from servefleet.base import flags
from servefleet.base.errors import DataError, RecipeError
from servefleet.base.remote.layout import RUNFILE_DIR, SECRETS_DIR
from servefleet.kinds import Kind, deploy_env, family_keys, kind_of, platforms_of
from servefleet.platforms.base import Platform
from servefleet.settings.check_paths import serve_file
from servefleet.settings.check_words import API_KEY, API_KEY_ALLOWED


def kind_pinned(pins: dict[str, str], recipe: Any) -> None:
    """The recipe's kind needs its packages pinned (RBLN: rebel-compiler and vllm-rbln; GPU:
    vllm). A recipe that is not a name of one is left to serve_recipe's own check."""
    try:
        family = kind_of(recipe) if isinstance(recipe, str) else None
    except RecipeError:
        return
    required: tuple[str, ...] = ()
    for platform in platforms_of(family) if family else ():
        required += tuple(p for p in platform.required_pins() if p not in required)
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


NO_INDEX = "SERVEFLEET_NO_INDEX"  # "1": this run reaches no index (status, lock --check):
# the index credentials are not needed, so monitoring and CI need not hold them


def _credentials(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    if values["sdk_source"] == "wheelhouse":  # hosts reach no index; `servefleet wheelhouse` did
        return
    if environ.get(NO_INDEX) == "1":
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
        table = flags.table(platforms_of(kind_of(values["serve_recipe"]))[0].flag_table)
    except RecipeError:  # serve_recipe's own error, where the recipe is resolved
        return
    flags.extra_units("serve_extra_args", values["serve_extra_args"], table)
    flags.check_env("serve_extra_env", values["serve_extra_env"], table, deploy_env())
    flags.override_dests("serve_override_args", values["serve_override_args"], table)


def _key_passed_on(key: str, what: str, values: dict[str, Any], environ: Mapping[str, str]) -> None:
    """The value of the variable ``key`` names, when it is set, is a key servefleet passes on
    (``what`` names it in the message, which never shows the value)."""
    name = values[key]
    value = environ.get(name)
    if value and not API_KEY.fullmatch(value):
        raise DataError(
            f"{key}: the value of {name} (not shown) is not {what} servefleet passes on; "
            f"allowed: {API_KEY_ALLOWED}"
        )


def _api_key(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    _key_passed_on("creds_api_key_env", "an API key", values, environ)


# The serve user owns these trees (its servers write there) ...
SERVE_TREES = ("serve_home", "serve_cache_root", "models_hf_home")
# ... and root alone writes these: none may be equal to or inside another's (#18 finding 4).
ROOT_TREES = {"serve_root": None, "the secrets directory": SECRETS_DIR,
              "the driver runfiles": RUNFILE_DIR}  # fmt: skip


def _inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def trees_apart(values: dict[str, Any], defaults: Mapping[str, Any]) -> None:
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
                    f"{serve_key} {defaults[serve_key]!r}, serve_root {defaults['serve_root']!r})"
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
    _key_passed_on("creds_router_admin_key_env", "a key", values, environ)


def _files_inside(values: dict[str, Any], environ: Mapping[str, str]) -> None:
    for argv, source in values["serve_files"].items():
        serve_file(values["serve_files_root"], argv, source)


ACROSS: dict[str, Callable[[dict[str, Any], Mapping[str, str]], None]] = {
    "serve_files_root": _files_inside,
    "serve_router_breaker_failures": _router,
    "sdk_extra_packages": _extras_pinned,
    "sdk_wheelhouse": _wheelhouse,
    "pip_indexes": _indexes_pinned,
    "creds_index_password_env": _credentials,
    "creds_api_key_env": _api_key,
    "serve_override_args": _extras_known,
}


# Keys a platform reads that a mixed fleet names once for every host (its group_data/all.py:
# where the RBLN driver's runfiles and their apt source are, as the lab's group data does):
# accepted on any host, read only where a platform installs a runfile
FLEET_WIDE = frozenset({"driver_runfile_url", "driver_sha256", "driver_apt_repo"})


def unread_key(given: Iterable[str], family: Kind, hosts: list[Platform]) -> str | None:
    """The first key the data sets (not a default) that a recipe family or a platform reads of
    its own but no seam of this host does, as one line naming the key, who reads it and what
    this host is; None when there is none.

    + given: the keys the host's data sets
    + family: the family of the host's recipe
    + hosts: the platforms the host may be (before its probe: every platform of its family;
      after: the one its probe showed)
    """
    by_family, by_platform = family_keys(), platforms.keys_read()
    for key in sorted(k for k in given if isinstance(k, str) and k not in FLEET_WIDE):
        readers = by_family.get(key, [])
        if readers and family not in readers:
            names = " or ".join(k.kind for k in readers)
            return (
                f"{key}: read by the {names} recipe family only; this host's recipe family is "
                f"{family.kind}; allowed: unset on this host, or a serve_recipe of the {names} "
                "family"
            )
        served = by_platform.get(key, [])
        if served and not any(p in served for p in hosts):
            names = " or ".join(p.name for p in served)
            this = " or ".join(p.name for p in hosts)
            return (
                f"{key}: read by the {names} platform only; this host's platform is {this}; "
                "allowed: unset on this host"
            )
    return None


def keys_read_here(given: Iterable[str] | None, recipe: Any) -> None:
    """Every key the data sets is read by the family of its recipe or one of that family's
    platforms (:func:`unread_key`); DataError names the first that is not. A recipe that is not
    a name of one is left to serve_recipe's own check.

    + given: the keys the host's data sets (None: not known, nothing checked)
    + recipe: serve_recipe
    """
    try:
        family = kind_of(recipe) if isinstance(recipe, str) and given is not None else None
    except RecipeError:
        return
    problem = unread_key(given or (), family, platforms_of(family)) if family else None
    if problem:
        raise DataError(problem)
