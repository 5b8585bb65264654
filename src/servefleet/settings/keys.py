"""How a data key is declared, and how a host's data is read against the key table.

The key table (:class:`servefleet.settings.table.Settings`) declares each key with :func:`key`:
its check, its default (:data:`KIND` where the platform decides it) and its one-line meaning.
This module is what reads that table: every key's name, meaning and default (the default kind's
where the table says :data:`KIND`), and a host's data validated whole against it
(:func:`validated`: the unknown keys refused, a key the host lacks given its default, one check
per key in the table's order, then the checks across keys of :mod:`servefleet.settings.across`).
The table's module binds these to its table (``KEYS``, ``DEFAULTS``, ``settings_from``); nothing
here names a key but the few the reading itself needs (the recipe, the trusted hosts).

Pure Python (no pyinfra import).
"""

from __future__ import annotations

import copy
import difflib
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from servefleet.base.errors import DataError, RecipeError
from servefleet.kinds import default_kind, kind_of
from servefleet.settings import across, check_net as net, checks as c
from servefleet.settings.checks import Check

__all__ = [
    "KIND",
    "PREFIXES",
    "Trusted",
    "defaults_of",
    "docs_of",
    "key",
    "changed",
    "keys_of",
    "validated",
]

# A data key is a name with one of these prefixes, one per area
PREFIXES = ("driver_", "sdk_", "pip_", "creds_", "serve_", "models_", "monitoring_", "rollout_")


class _FromKind:
    """The default of a key each platform decides: its recipe's kind's (``Kind.defaults``)."""

    def __repr__(self) -> str:
        return "KIND"


KIND: Any = _FromKind()  # a key's default in the table: the kind's


@dataclass(frozen=True)
class Trusted:
    """A check that depends on ``pip_trusted_hosts`` (http is allowed on those hosts only)."""

    make: Callable[[frozenset[str] | None], Check]


def key(check: Check | Trusted, default: Any, doc: str, given: str = "") -> Any:
    """One data key of the table: its check, its default (as data gives it) and its one-line
    meaning. The field itself holds the checked value; ``given`` is the type data gives it
    where that is not the field's (``list[str]`` of pins checked into a ``dict[str, str]``), as
    ``servefleet keys`` and docs/data.md show it."""
    return field(metadata={"check": check, "default": default, "doc": doc, "given": given})


def keys_of(table: type[Any]) -> tuple[str, ...]:
    """Every data key of ``table`` (its fields declared with :func:`key`), in order."""
    return tuple(f.name for f in fields(table) if "check" in f.metadata)


def docs_of(table: type[Any]) -> dict[str, str]:
    """Every data key of ``table`` -> its one-line meaning."""
    return {f.name: f.metadata["doc"] for f in fields(table) if "check" in f.metadata}


def defaults_of(table: type[Any]) -> dict[str, Any]:
    """Every key's default under the default kind: the table's, the kind's where it says
    :data:`KIND`."""
    kind = default_kind()
    written = {f.name: f.metadata["default"] for f in fields(table) if "check" in f.metadata}
    missing = [k for k, v in written.items() if v is KIND and k not in kind.defaults]
    if missing:
        raise DataError(
            f"the default kind {kind.kind} has no default for {', '.join(missing)}; allowed: a "
            "kind whose defaults give every key the key table leaves to the kind"
        )
    return {k: kind.defaults[k] if v is KIND else v for k, v in written.items()}


def _checks(table: type[Any], trusted: frozenset[str] | None) -> dict[str, Check]:
    """One check per data key, in the table's order; http is allowed on ``trusted``."""
    out = {}
    for f in fields(table):
        check = f.metadata.get("check")
        if check is not None:
            out[f.name] = check.make(trusted) if isinstance(check, Trusted) else check
    return out


def _kind_defaults(recipe: Any) -> Mapping[str, Any]:
    """The defaults of the kind of the recipe data names, over the table's; none for a recipe
    that is not found (serve_recipe's own check says what is wrong with it)."""
    try:
        return kind_of(recipe).defaults if isinstance(recipe, str) else {}
    except RecipeError:
        return {}


@functools.lru_cache(maxsize=4096)
def _misspelt(key: str, known: tuple[str, ...]) -> bool:
    """A key without our prefixes that is one slip from one of ours (``sevre_target``): pyinfra's
    own keys (``ssh_user``, ``_sudo``) are nowhere near one."""
    return difflib.get_close_matches(key, known, n=1, cutoff=0.85) != []


def _refuse_unknown(keys: Iterable[str], known: tuple[str, ...]) -> None:
    ours = [
        k for k in keys if isinstance(k, str) and (k.startswith(PREFIXES) or _misspelt(k, known))
    ]
    for key in sorted(ours):
        if key not in known:
            close = c.closest(key, known, cutoff=0.7)  # keys share long prefixes
            hint = (
                f"did you mean {close}?"
                if close
                else "allowed: the keys of servefleet/settings/table.py"
            )
            raise DataError(f"{key if key.isprintable() else repr(key)}: unknown data key; {hint}")


def validated(
    table: type[Any],
    defaults: Mapping[str, Any],
    get: Callable[[str], Any],
    environ: Mapping[str, str],
    keys: Iterable[str] | None,
) -> dict[str, Any]:
    """A host's data validated whole against ``table``: every data key -> its checked value;
    DataError names the first bad key.

    + table: the key table
    + defaults: every key's default when the data names no recipe (``defaults_of(table)``)
    + get: returns the value of a data key (None when unset)
    + environ: where the checks across keys read credential variables from
    + keys: every data key the host has: ones with our prefixes that the table does not define
      are refused, and a key the host lacks takes its default (its recipe's kind's, else
      ``defaults``'); None: ``get`` answers for every key
    """
    have = None if keys is None else set(keys)
    if have is not None:
        _refuse_unknown(have, keys_of(table))

    kind_defaults = _kind_defaults(
        get("serve_recipe") if have is None or "serve_recipe" in have else defaults["serve_recipe"]
    )

    def read(key: str) -> Any:
        if have is None or key in have:
            return get(key)
        return copy.deepcopy(kind_defaults.get(key, defaults[key]))

    values: dict[str, Any] = {}
    checks = _checks(table, net.trusted_of(read("pip_trusted_hosts")))
    for key, check in checks.items():
        try:
            values[key] = check(read(key))
        except c.Refused as e:
            raise e.error(key) from None
        if key == "sdk_pins":
            across.kind_pinned(values[key], read("serve_recipe"))
        if key in across.ACROSS:
            across.ACROSS[key](values, environ)
    across.trees_apart(values, defaults)
    if have is not None:  # a key set to other than its default: read by a seam of this host
        across.keys_read_here(changed(table, defaults, values, have), values["serve_recipe"])
    return values


def changed(
    table: type[Any], defaults: Mapping[str, Any], values: Mapping[str, Any], have: Iterable[str]
) -> frozenset[str]:
    """The keys of ``have`` the data sets to other than their default (its recipe's kind's,
    else ``defaults``'), as checked values: what a seam of the host must read.

    + table: the key table
    + defaults: every key's default when the data names no recipe
    + values: the host's checked values (:func:`validated`)
    + have: every data key the host has
    """
    checks = _checks(table, net.trusted_of(list(values["pip_trusted_hosts"])))
    kind_defaults = _kind_defaults(values["serve_recipe"])
    out = set()
    for key in have:
        if key in checks:
            default = copy.deepcopy(kind_defaults.get(key, defaults[key]))
            try:
                if values[key] != checks[key](default):
                    out.add(key)
            except c.Refused:  # pragma: no cover - every default passes its check
                out.add(key)
    return frozenset(out)
