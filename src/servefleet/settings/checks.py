"""The checks of deploy data values: each takes a value as pyinfra gives it and returns it
converted, or raises :class:`Refused` (``<value> <what is wrong>`` and what is allowed).

This module holds what every check is built from (:class:`Refused`, the messages' value,
strings, patterns, lists, mappings and records of checks) and the scalar checks: whole numbers,
flags and the keys that take one of a few words. The others check by what they check:
:mod:`~servefleet.settings.check_net` (hosts, URLs, apt sources),
:mod:`~servefleet.settings.check_paths` (paths, serve trees, commands, shipped files),
:mod:`~servefleet.settings.check_names` (names, versions, pins, package indexes) and
:mod:`~servefleet.settings.check_words` (command-line words and variables). The key table
(:mod:`servefleet.settings.table`) names one check per data key. Pure Python.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from servefleet.base.errors import DataError

MAX_PORT = 65535
TARGETS = ("Latency", "Throughput")
DIGITS = re.compile(r"[0-9]{1,20}")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


# ---------------------------------------------------------------------------------------------
# Checks: each takes a value as pyinfra gives it and returns it converted, or raises Refused


class Refused(Exception):
    """A refused value: ``head`` says what is wrong, ``allowed`` what would do; ``where`` is the
    path below the data key (``.rbln.url``)."""

    def __init__(self, head: str, allowed: str, where: str = "") -> None:
        super().__init__(head)
        self.head, self.allowed, self.where = head, allowed, where

    def error(self, key: str) -> DataError:
        return DataError(f"{key}{self.where}: {self.head}; allowed: {self.allowed}")


Check = Callable[[Any], Any]


def show(value: Any) -> str:
    """A value for a one-line message: its repr (which escapes newlines), cut when long, with
    any ``user:password@`` of a URL in it masked."""
    text = re.sub(r"(?<=[:/])[^/@\s'\"]*@", "***@", repr(value))
    return text if len(text) <= 120 else text[:117] + "..."


def bad(value: Any, problem: str, allowed: str) -> Refused:
    return Refused(f"{show(value)} {problem}", allowed)


def typed(value: Any, kind: type | tuple[type, ...], what: str, allowed: str) -> Any:
    """``value`` if it is a ``kind`` (str, list, Mapping: never converted), else refused."""
    if isinstance(value, kind):
        return value
    raise Refused(f"expected {what}, got {show(value)}", allowed)


def one_line(what: str, allowed: str, *, empty: bool = False) -> Check:
    def check(value: Any) -> str:
        text = typed(value, str, "a string", allowed)
        if not text and not empty:
            raise bad(text, f"is not {what}", allowed)
        if CONTROL.search(text):
            raise bad(text, "holds a control character", allowed)
        return text

    return check


def matching(pattern: re.Pattern[str], what: str, allowed: str) -> Check:
    def check(value: Any) -> str:
        text = typed(value, str, "a string", allowed)
        if not pattern.fullmatch(text):
            raise bad(text, f"is not {what}", allowed)
        return text

    return check


def whole(low: int, high: int | None = None) -> Check:
    """An int (or a string of digits), never a bool or a float, within [low, high]."""
    allowed = f"{low}-{high}" if high is not None else f"a whole number >= {low}"

    def check(value: Any) -> int:
        if isinstance(value, str) and DIGITS.fullmatch(value):
            number = int(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            raise Refused(f"expected a whole number, got {show(value)}", allowed)
        if number < low or (high is not None and number > high):
            raise bad(value, "is out of range", allowed)
        return number

    return check


def optional(check: Check) -> Check:
    def optional(value: Any) -> Any:
        if value is None:
            return None
        try:
            return check(value)
        except Refused as e:
            raise Refused(e.head, f"{e.allowed}, or None", e.where) from None

    return optional


def within(where: str, check: Check, value: Any) -> Any:
    """``check(value)``, a refusal naming ``.<where>`` below the key."""
    try:
        return check(value)
    except Refused as e:
        raise Refused(e.head, e.allowed, f".{where}{e.where}") from None


def listed(item: Check, allowed: str, *, empty: bool = True) -> Check:
    """A list (or tuple) of items, each checked; a tuple of the results."""

    def check(value: Any) -> tuple[Any, ...]:
        items = typed(value, (list, tuple), "a list", allowed)
        if not items and not empty:
            raise bad(value, "is empty", allowed)
        return tuple(item(v) for v in items)

    return check


def entries(key: Check, value: Check, allowed: str) -> Check:
    """A mapping, its keys and values checked (a bad value is named ``.<key>``)."""

    def check(data: Any) -> dict[Any, Any]:
        out = {}
        for k, v in typed(data, Mapping, "a mapping", allowed).items():
            k = key(k)
            out[k] = within(str(k), value, v)
        return out

    return check


def record(fields: Mapping[str, Check], required: tuple[str, ...], allowed: str) -> Check:
    """A mapping with only these fields (the required ones present), each checked."""

    def check(value: Any) -> dict[str, Any]:
        given = typed(value, Mapping, "a mapping", allowed)
        for name in given:
            if name not in fields:
                close = closest(name, fields)
                hint = f" (did you mean {close}?)" if close else ""
                raise bad(name, f"is not a field{hint}", ", ".join(fields))
        missing = [name for name in required if name not in given]
        if missing:
            raise Refused(f"has no {missing[0]!r}", allowed)
        return {name: within(name, fields[name], v) for name, v in given.items()}

    return check


def closest(name: Any, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name ``name`` is most likely a misspelling of (difflib), if any."""
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def boolean(value: Any) -> bool:
    """A bool, nothing else (pip_indexes.*.auth)."""
    if isinstance(value, bool):
        return value
    raise Refused(f"expected true or false, got {show(value)}", "True or False")


def flag(value: Any) -> bool:
    """A bool, or one of the strings true/false/yes/no/1/0 (never an int)."""
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    try:
        return boolean(value)
    except Refused as e:
        raise Refused(e.head, "true, false (or 'yes', 'no', '1', '0')") from None


def serve_target(value: Any) -> str:
    allowed = ", ".join(TARGETS)
    text = typed(value, str, "a string", allowed)
    target = {t.lower(): t for t in TARGETS}.get(text.lower())
    if target is None:
        raise bad(text, "is not a target", allowed)
    return target


INSTALLERS = ("uv", "pip")


def installer(value: Any) -> str:
    if value not in INSTALLERS:
        raise bad(value, "is not an installer", " or ".join(INSTALLERS))
    return str(value)


SOURCES = ("index", "wheelhouse")


def package_source(value: Any) -> str:
    if value not in SOURCES:
        raise bad(value, "is not a package source", " or ".join(SOURCES))
    return str(value)


PREWARM_SCOPES = ("host", "fleet")


def prewarm_scope(value: Any) -> str:
    if value not in PREWARM_SCOPES:
        raise bad(value, "is not a pre-warm scope", " or ".join(PREWARM_SCOPES))
    return str(value)


ROUTERS = ("none", "host", "fleet")
# vllm-router's --policy values that need nothing beyond the worker list (kv_aware needs KV
# event sources, sticky_least_loaded sessions)
ROUTER_POLICIES = ("round_robin", "random", "cache_aware", "power_of_two", "consistent_hash")


def router(value: Any) -> str:
    if value not in ROUTERS:
        raise bad(value, "is not a router placement", ", ".join(ROUTERS))
    return str(value)


def router_policy(value: Any) -> str:
    if value not in ROUTER_POLICIES:
        raise bad(value, "is not a router policy", ", ".join(ROUTER_POLICIES))
    return str(value)
