"""The checks of deploy data values: each takes a value as pyinfra gives it and returns it
converted, or raises :class:`Refused` (``<value> <what is wrong>`` and what is allowed).

The key table (:mod:`servefleet.settings.table`) names one check per data key. Pure Python.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name as canonical_name  # PEP 503 (Rebel_Compiler)
from packaging.version import InvalidVersion, Version

from servefleet.base.errors import DataError
from servefleet.remote.layout import SERVE_TREE_ROOTS

MAX_PORT = 65535
TARGETS = ("Latency", "Throughput")
# Directories a serve_*/models_* path may be below but never be (any /usr/<dir> too)
SYSTEM_DIRS = frozenset(
    ["/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32"]
    + ["/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys"]
    + ["/tmp", "/usr", "/var", "/var/backups", "/var/cache", "/var/lib", "/var/local"]
    + ["/var/lock", "/var/log", "/var/mail", "/var/opt", "/var/run", "/var/spool", "/var/tmp"]
)
VIRTUAL_DIRS = ("/dev/", "/proc/", "/sys/")

_PACKAGE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")  # PEP 508 name
DEB_PACKAGE = re.compile(r"[a-z0-9]([a-z0-9+.-]|\{kernel\})+")
SLUG = re.compile(r"[a-z0-9_-]+")
PD_ROLE = re.compile(r"prefill|decode")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # axes, index names
_AXIS_VALUE = re.compile(r"[^\x00-\x1f\x7f-\x9f%$]+")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_FLAG = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9._-]*")
API_KEY = re.compile(r"[A-Za-z0-9._~+/=:@%,-]{16,1024}")
API_KEY_ALLOWED = "16-1024 characters of A-Za-z0-9 and ._~+/=:@%,- (e.g. `openssl rand -hex 32`)"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")  # fmt: skip
_PATH = re.compile(r"[A-Za-z0-9._/-]+")
_COMMAND = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*|(/[A-Za-z0-9._-]+)+")
_DEB_LINE = re.compile(r"deb (\[[^\]]+\] )?(?P<url>\S+) \S+( \S+)*")
SHA256 = re.compile(r"[0-9a-f]{64}")
REVISION = re.compile(r"[0-9a-f]{40}")
_DIGITS = re.compile(r"[0-9]{1,20}")
_GLIBC = re.compile(r"[1-9][0-9]{0,2}\.(0|[1-9][0-9]{0,2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NOT_IN_URL = re.compile(r"[\s\"'`\\<>{}|^\x00-\x1f\x7f-\x9f]")
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")

_URL_ALLOWED = "an https URL (http only on a host of pip_trusted_hosts), without user:password@"
_CREDS_ALLOWED = "a URL without user:password@ (creds_*_env name the variables holding secrets)"
_DIR_ALLOWED = "an absolute, normalised path of [A-Za-z0-9._/-] below a system directory"
_TREE_ALLOWED = (
    "an absolute, normalised path of [A-Za-z0-9._/-], a directory of its own strictly below "
    f"{', '.join(SERVE_TREE_ROOTS)} (e.g. /var/lib/servefleet)"
)
_HOST_ALLOWED = "an IP address or a host name of [A-Za-z0-9.-]"
_VERSION_ALLOWED = "a PEP 440 version string in normal form, such as '3.5.1'"
_PIN_ALLOWED = "'name==version' (a PEP 508 name, a PEP 440 version), one pin per package"
PACKAGES_ALLOWED = "a list of PEP 508 package names"
_INDEX_ALLOWED = (
    "index name -> {'url': URL, 'packages': [names], 'auth': True or False, 'glibc': '2.39'}"
)
_GLIBC_ALLOWED = "the lowest glibc the index's wheels need, as 'MAJOR.MINOR' (e.g. '2.39')"
_OWNED_ALLOWED = (
    "each package in one index at most, or in several that each declare a different glibc"
)
_DEB_ALLOWED = "one line 'deb [signed-by=KEYRING] URL SUITE [COMPONENT...]', no user:password@"
_REPO_ALLOWED = "{'src': deb source line, 'key': local key file (optional)}"
DEB_PACKAGE_ALLOWED = "a list of Debian package names ([a-z0-9+.-], {kernel} = `uname -r`)"
_COMMAND_ALLOWED = "a command name or an absolute path, of [A-Za-z0-9._/-]"
_SELECTION_ALLOWED = (
    "axis -> value (or 'axis=value,...'), values without %, $ or control characters"
)
_USER_ALLOWED = "a system user name [a-z_][a-z0-9_-]{0,31}, not root"
MODELS_ALLOWED = "model id ORG/NAME of [A-Za-z0-9._-] -> hex digest"


@dataclass(frozen=True)
class Index:
    """One package index and the distributions it owns."""

    name: str
    url: str
    packages: tuple[str, ...]
    auth: bool = False
    glibc: str | None = None  # the lowest glibc its wheels need (manylinux_2_39: "2.39")


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


def _show(value: Any) -> str:
    """A value for a one-line message: its repr (which escapes newlines), cut when long, with
    any ``user:password@`` of a URL in it masked."""
    text = re.sub(r"(?<=[:/])[^/@\s'\"]*@", "***@", repr(value))
    return text if len(text) <= 120 else text[:117] + "..."


def _bad(value: Any, problem: str, allowed: str) -> Refused:
    return Refused(f"{_show(value)} {problem}", allowed)


def _typed(value: Any, kind: type | tuple[type, ...], what: str, allowed: str) -> Any:
    """``value`` if it is a ``kind`` (str, list, Mapping: never converted), else refused."""
    if isinstance(value, kind):
        return value
    raise Refused(f"expected {what}, got {_show(value)}", allowed)


def one_line(what: str, allowed: str, *, empty: bool = False) -> Check:
    def check(value: Any) -> str:
        text = _typed(value, str, "a string", allowed)
        if not text and not empty:
            raise _bad(text, f"is not {what}", allowed)
        if _CONTROL.search(text):
            raise _bad(text, "holds a control character", allowed)
        return text

    return check


def matching(pattern: re.Pattern[str], what: str, allowed: str) -> Check:
    def check(value: Any) -> str:
        text = _typed(value, str, "a string", allowed)
        if not pattern.fullmatch(text):
            raise _bad(text, f"is not {what}", allowed)
        return text

    return check


def whole(low: int, high: int | None = None) -> Check:
    """An int (or a string of digits), never a bool or a float, within [low, high]."""
    allowed = f"{low}-{high}" if high is not None else f"a whole number >= {low}"

    def check(value: Any) -> int:
        if isinstance(value, str) and _DIGITS.fullmatch(value):
            number = int(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            raise Refused(f"expected a whole number, got {_show(value)}", allowed)
        if number < low or (high is not None and number > high):
            raise _bad(value, "is out of range", allowed)
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


def _within(where: str, check: Check, value: Any) -> Any:
    """``check(value)``, a refusal naming ``.<where>`` below the key."""
    try:
        return check(value)
    except Refused as e:
        raise Refused(e.head, e.allowed, f".{where}{e.where}") from None


def listed(item: Check, allowed: str, *, empty: bool = True) -> Check:
    """A list (or tuple) of items, each checked; a tuple of the results."""

    def check(value: Any) -> tuple[Any, ...]:
        items = _typed(value, (list, tuple), "a list", allowed)
        if not items and not empty:
            raise _bad(value, "is empty", allowed)
        return tuple(item(v) for v in items)

    return check


def entries(key: Check, value: Check, allowed: str) -> Check:
    """A mapping, its keys and values checked (a bad value is named ``.<key>``)."""

    def check(data: Any) -> dict[Any, Any]:
        out = {}
        for k, v in _typed(data, Mapping, "a mapping", allowed).items():
            k = key(k)
            out[k] = _within(str(k), value, v)
        return out

    return check


def _record(fields: Mapping[str, Check], required: tuple[str, ...], allowed: str) -> Check:
    """A mapping with only these fields (the required ones present), each checked."""

    def check(value: Any) -> dict[str, Any]:
        given = _typed(value, Mapping, "a mapping", allowed)
        for name in given:
            if name not in fields:
                close = closest(name, fields)
                hint = f" (did you mean {close}?)" if close else ""
                raise _bad(name, f"is not a field{hint}", ", ".join(fields))
        missing = [name for name in required if name not in given]
        if missing:
            raise Refused(f"has no {missing[0]!r}", allowed)
        return {name: _within(name, fields[name], v) for name, v in given.items()}

    return check


def closest(name: Any, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name ``name`` is most likely a misspelling of (difflib), if any."""
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def _is_host(text: str) -> bool:
    """An IP address, or a host name of dot-separated [A-Za-z0-9-] labels (the last one not all
    digits: ``10.0.0.300`` is a bad address, not a name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return bool(_HOSTNAME.fullmatch(text)) and not text.rsplit(".", 1)[-1].isdigit()
    return True


def host_name(value: Any) -> str:
    text = _typed(value, str, "a string", _HOST_ALLOWED)
    if not _is_host(text):
        raise _bad(text, "is not an IP address or a host name", _HOST_ALLOWED)
    return text


def _authority(url: str) -> str:
    """What stands between a URL's scheme and its path (``user:password@host:port``)."""
    rest = url.split(":", 1)[-1].lstrip("/")
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def url_check(trusted: frozenset[str] | None, placeholder: str = "") -> Check:
    """An https URL, or http on a ``trusted`` host (any host when None: pip_trusted_hosts is
    bad, and refused in its turn); never with credentials (nor shows them)."""
    allowed = _URL_ALLOWED + (f" ({placeholder} is filled in)" if placeholder else "")

    def check(value: Any) -> str:
        url = _typed(value, str, "a string", allowed)
        if "@" in _authority(url):  # before any message that would show the password
            raise Refused("credentials do not belong in data", _CREDS_ALLOWED)
        if _NOT_IN_URL.search(url.replace(placeholder, "") if placeholder else url):
            raise _bad(url, "holds a space, quote, brace or control character", allowed)
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise _bad(url, "has an invalid host or port", allowed) from None
        host = parts.hostname or ""
        if parts.scheme not in ("http", "https"):
            raise _bad(url, "is not an https URL", allowed)
        if not _is_host(host) or port == 0:
            raise _bad(url, "has no valid host and port", allowed)
        if parts.scheme == "http" and trusted is not None and host not in trusted:
            raise _bad(url, f"is http on {host}, a host not in pip_trusted_hosts", allowed)
        return url

    return check


trusted_hosts = listed(host_name, "a list of IP addresses or host names")


def trusted_of(value: Any) -> frozenset[str] | None:
    """pip_trusted_hosts as the URL checks see it, None when it is bad."""
    try:
        return frozenset(host.lower() for host in trusted_hosts(value))
    except Refused:
        return None


def directory(value: Any) -> str:
    """An absolute, normalised path of safe characters that is not a system directory."""
    path = _typed(value, str, "a string", _DIR_ALLOWED)
    if not path.startswith("/"):
        raise _bad(path, "is not absolute", _DIR_ALLOWED)
    if not _PATH.fullmatch(path):
        raise _bad(path, "holds a character outside [A-Za-z0-9._/-]", _DIR_ALLOWED)
    normal = "/" + posixpath.normpath(path).lstrip("/")
    if path != normal:
        raise _bad(path, f"is not normalised (write {normal!r})", _DIR_ALLOWED)
    if path in SYSTEM_DIRS or posixpath.dirname(path) == "/usr":
        raise _bad(path, "is a system directory", _DIR_ALLOWED)
    if path.startswith(VIRTUAL_DIRS):
        raise _bad(path, "is on a virtual file system", _DIR_ALLOWED)
    return path


def serve_tree(value: Any) -> str:
    """A :func:`directory` the serve user gets: strictly below one of the roots meant for it
    (``layout.SERVE_TREE_ROOTS``), never a system directory nor the root itself."""
    try:
        path = directory(value)
    except Refused as e:
        raise Refused(e.head, _TREE_ALLOWED) from None
    if not any(path.startswith(root + "/") for root in SERVE_TREE_ROOTS):
        raise _bad(path, "is not below a directory meant for the serve user's trees", _TREE_ALLOWED)
    return path


def pep440_version(value: Any) -> str:
    """A PEP 440 version, written as ``packaging`` normalises it (so it compares as text)."""
    text = _typed(value, str, "a string", _VERSION_ALLOWED)
    try:
        normal = str(Version(text))
    except InvalidVersion:
        raise _bad(text, "is not a PEP 440 version", _VERSION_ALLOWED) from None
    if text != normal:
        raise _bad(text, f"is not in normal form (write {normal!r})", _VERSION_ALLOWED)
    return text


def _pins(value: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for pin in _typed(value, (list, tuple), "a list of 'name==version' pins", _PIN_ALLOWED):
        text = _typed(pin, str, "a 'name==version' string", _PIN_ALLOWED)
        name, exact, version = text.partition("==")
        if not exact or not _PACKAGE.fullmatch(name):
            raise _bad(text, "is not an exact pin", _PIN_ALLOWED)
        try:
            pep440_version(version)
        except Refused as e:
            raise _bad(text, f"has a bad version: {e.head}", _PIN_ALLOWED) from None
        if canonical_name(name) in out:
            raise _bad(text, f"pins {canonical_name(name)} a second time", _PIN_ALLOWED)
        out[canonical_name(name)] = version
    return out


def parse_pins(pins: Any, key: str = "sdk_pins") -> dict[str, str]:
    """``["name==1.0", ...]`` -> ``{canonical name: version}``; anything but ``==`` is refused."""
    try:
        return _pins(pins)
    except Refused as e:
        raise e.error(key) from None


# ---------------------------------------------------------------------------------------------
# The data keys (servefleet/defaults.py)


def package_name(value: Any) -> str:
    name = matching(_PACKAGE, "a package name", "a PEP 508 package name")(value)
    return canonical_name(name)


def _deb_source(value: Any) -> str:
    line = one_line("a deb source line", _DEB_ALLOWED)(value)
    found = _DEB_LINE.fullmatch(line)
    if not found:
        raise _bad(line, "is not a deb source line", _DEB_ALLOWED)
    if "@" in _authority(found["url"]):
        raise Refused("credentials do not belong in data", _CREDS_ALLOWED)
    if not found["url"].startswith(("http://", "https://", "file:/")):
        raise _bad(line, "has no http, https or file URL", _DEB_ALLOWED)
    return line


def apt_repo(value: Any) -> dict[str, str]:
    key = optional(one_line("a file path", "a local file path (the repository's key)"))
    repo = _record({"src": _deb_source, "key": key}, ("src",), _REPO_ALLOWED)(value)
    if repo.get("key") and "signed-by=" not in repo["src"]:
        raise _bad(repo["key"], "is given but src has no [signed-by=KEYRING]", _REPO_ALLOWED)
    return {k: v for k, v in repo.items() if v is not None}


def sdk_pins(value: Any) -> dict[str, str]:
    return _pins(value)


def indexes(url: Check) -> Check:
    spec = _record(
        {
            "url": url,
            "packages": listed(package_name, PACKAGES_ALLOWED, empty=False),
            "auth": _bool,
            "glibc": matching(_GLIBC, "a glibc version", _GLIBC_ALLOWED),
        },
        ("url", "packages"),
        _INDEX_ALLOWED,
    )
    by_name = entries(matching(_NAME, "an index name", _INDEX_ALLOWED), spec, _INDEX_ALLOWED)

    def check(value: Any) -> tuple[Index, ...]:
        owners: dict[str, list[Index]] = {}
        out = []
        for name, entry in by_name(value).items():
            index = Index(
                name,
                entry["url"].rstrip("/"),
                entry["packages"],
                entry.get("auth", False),
                entry.get("glibc"),
            )
            for package in index.packages:
                for other in owners.get(package, []):
                    if other.glibc is None or index.glibc is None:
                        raise Refused(
                            f"{package} is owned by the {other.name} index already",
                            _OWNED_ALLOWED,
                            f".{name}.packages",
                        )
                    if Version(other.glibc) == Version(index.glibc):
                        raise Refused(
                            f"{package} is owned by the {other.name} index already, for the "
                            f"same glibc {other.glibc}",
                            _OWNED_ALLOWED,
                            f".{name}.glibc",
                        )
                owners.setdefault(package, []).append(index)
            out.append(index)
        return tuple(out)

    return check


def _bool(value: Any) -> bool:
    """A bool, nothing else (pip_indexes.*.auth)."""
    if isinstance(value, bool):
        return value
    raise Refused(f"expected true or false, got {_show(value)}", "True or False")


def flag(value: Any) -> bool:
    """A bool, or one of the strings true/false/yes/no/1/0 (never an int)."""
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    try:
        return _bool(value)
    except Refused as e:
        raise Refused(e.head, "true, false (or 'yes', 'no', '1', '0')") from None


def serve_target(value: Any) -> str:
    allowed = ", ".join(TARGETS)
    text = _typed(value, str, "a string", allowed)
    target = {t.lower(): t for t in TARGETS}.get(text.lower())
    if target is None:
        raise _bad(text, "is not a target", allowed)
    return target


_axes = entries(
    matching(_NAME, "an axis name", _SELECTION_ALLOWED),
    matching(_AXIS_VALUE, "an axis value", _SELECTION_ALLOWED),
    _SELECTION_ALLOWED,
)


_FEATURES = entries(
    matching(SLUG, "a feature", "a feature name of the recipe"),
    matching(SLUG, "on, off or a mode", "on, off or a mode name"),
    "feature -> on, off or a mode",
)


def features(value: Any) -> dict[str, str]:
    """A mapping feature -> on/off/mode, or its command-line form ``name=on,name=off``."""
    if isinstance(value, str):  # --data serve_features=spec_decoding=on
        pairs = [p.split("=", 1) for p in value.split(",") if p]
        if not all(len(p) == 2 for p in pairs):
            raise Refused(
                f"expected NAME=MODE pairs separated by commas, got {_show(value)}",
                "feature -> on, off or a mode",
            )
        value = dict(pairs)
    result: dict[str, str] = _FEATURES(value)
    return result


def selection(value: Any) -> dict[str, str]:
    """A mapping axis -> value, or its command-line form ``axis=value,axis=value``."""
    if isinstance(value, str):  # --data serve_selection=lmcache=cpu,spec_decode=suffix
        pairs = [p.split("=", 1) for p in value.split(",") if p]
        if not all(len(p) == 2 for p in pairs):
            raise Refused(
                f"expected AXIS=VALUE pairs separated by commas, got {_show(value)}",
                _SELECTION_ALLOWED,
            )
        axes = [axis for axis, _ in pairs]
        twice = next((axis for axis in axes if axes.count(axis) > 1), None)
        if twice is not None:
            raise _bad(value, f"sets axis {twice!r} twice", _SELECTION_ALLOWED)
        value = dict(pairs)
    return dict(_axes(value))


def command(value: Any) -> str:
    command = matching(_COMMAND, "a command name or absolute path", _COMMAND_ALLOWED)(value)
    if command.startswith("/") and posixpath.normpath(command) != command:
        raise _bad(command, "is not normalised", _COMMAND_ALLOWED)
    return command


INSTALLERS = ("uv", "pip")


def installer(value: Any) -> str:
    if value not in INSTALLERS:
        raise _bad(value, "is not an installer", " or ".join(INSTALLERS))
    return str(value)


def python_specifier(value: Any) -> str:
    """A PEP 440 specifier of Python versions with at least one lower bound (``>=3.10``)."""
    allowed = "a version specifier such as >=3.10 or >=3.10,<3.14"
    if not isinstance(value, str):
        raise Refused(f"expected a string, got {_show(value)}", allowed)
    try:
        spec = SpecifierSet(value)
    except InvalidSpecifier:
        raise _bad(value, "is not a version specifier", allowed) from None
    if not any(s.operator in (">=", ">", "==", "~=") for s in spec):
        raise _bad(value, "has no lower bound", allowed)
    return str(value)


SOURCES = ("index", "wheelhouse")


def package_source(value: Any) -> str:
    if value not in SOURCES:
        raise _bad(value, "is not a package source", " or ".join(SOURCES))
    return str(value)


PREWARM_SCOPES = ("host", "fleet")


def prewarm_scope(value: Any) -> str:
    if value not in PREWARM_SCOPES:
        raise _bad(value, "is not a pre-warm scope", " or ".join(PREWARM_SCOPES))
    return str(value)


ROUTERS = ("none", "host", "fleet")
# vllm-router's --policy values that need nothing beyond the worker list (kv_aware needs KV
# event sources, sticky_least_loaded sessions)
ROUTER_POLICIES = ("round_robin", "random", "cache_aware", "power_of_two", "consistent_hash")


def router(value: Any) -> str:
    if value not in ROUTERS:
        raise _bad(value, "is not a router placement", ", ".join(ROUTERS))
    return str(value)


def router_policy(value: Any) -> str:
    if value not in ROUTER_POLICIES:
        raise _bad(value, "is not a router policy", ", ".join(ROUTER_POLICIES))
    return str(value)


def user_name(value: Any) -> str:
    name = matching(_USER, "a system user name", _USER_ALLOWED)(value)
    if name == "root":
        raise _bad(name, "may not run the servers", _USER_ALLOWED)
    return name


_ARGS_ALLOWED = (
    "a list of vllm serve flags and their values (or one string, split as a shell would)"
)
_ENV_ALLOWED = "NAME -> value (or 'NAME=value,...'), values without control characters"
_OVERRIDE_ALLOWED = (
    "a list (or 'a,b') of flags (--max-num-seqs) and variables (NAME) of serve_extra_args and "
    "serve_extra_env"
)


def _word(value: Any, allowed: str) -> str:
    """One argv token or env value from data: a string or a number, one line."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise Refused(f"expected a string, got {_show(value)}", allowed)
    text = str(value)
    if _CONTROL.search(text):
        raise _bad(text, "holds a control character", allowed)
    return text


def extra_args(value: Any) -> tuple[str, ...]:
    """More ``vllm serve`` tokens: a list, or one string split as a shell would
    (``--data serve_extra_args='--max-num-seqs 8'``). The flag table checks them later."""
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as e:
            raise _bad(value, f"cannot be split as a shell would ({e})", _ARGS_ALLOWED) from None
    items = _typed(value, (list, tuple), "a list", _ARGS_ALLOWED)
    out = tuple(_word(v, _ARGS_ALLOWED) for v in items)
    if "" in out:
        raise _bad(list(out), "holds an empty argument", _ARGS_ALLOWED)
    return out


def extra_env(value: Any) -> dict[str, str]:
    """More variables: a mapping NAME -> value, or ``NAME=value,NAME=value``."""
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.split(",") if p]
        if not all(len(p) == 2 for p in pairs):
            raise Refused(
                f"expected NAME=value pairs separated by commas, got {_show(value)}", _ENV_ALLOWED
            )
        value = dict(pairs)
    name = matching(ENV_NAME, "an environment variable name", _ENV_ALLOWED)
    result: dict[str, str] = entries(name, lambda v: _word(v, _ENV_ALLOWED), _ENV_ALLOWED)(value)
    return result


def override_names(value: Any) -> tuple[str, ...]:
    """Flags and variable names: a list, or ``--a,NAME``."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v]
    out = []
    for item in _typed(value, (list, tuple), "a list", _OVERRIDE_ALLOWED):
        text = _typed(item, str, "a string", _OVERRIDE_ALLOWED)
        if not (_FLAG.fullmatch(text) or ENV_NAME.fullmatch(text)):
            raise _bad(text, "is not a flag or a variable name", _OVERRIDE_ALLOWED)
        out.append(text)
    return tuple(out)


_FILES_ALLOWED = (
    "a mapping: the path a command line names (a chat template, a plugin, a config file) -> a "
    "readable regular file on the controller"
)


def serve_files(value: Any) -> dict[str, str]:
    """Files a command line names, shipped with the release: argv path -> controller file."""

    def controller_file(v: Any) -> str:
        path = _word(v, _FILES_ALLOWED)
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise _bad(path, "is not a readable regular file on the controller", _FILES_ALLOWED)
        return path

    def argv_path(v: Any) -> str:
        path = _word(v, _FILES_ALLOWED)
        if path.startswith("-"):
            raise _bad(path, "is an option, not a path", _FILES_ALLOWED)
        return path

    result: dict[str, str] = entries(argv_path, controller_file, _FILES_ALLOWED)(value)
    return result
