"""Deploy data: the package's defaults (:mod:`servefleet.defaults`) and a host's data validated
into Settings.

Pure Python (no pyinfra import): the deploy files call :func:`settings_from` on ``host.data`` at
the top, before any operation is added (and so before the deploys' ``data_defaults`` apply: a key
the host has no data for takes its default here). The data is validated whole, one check per key
of the defaults in their order (:func:`_checks`), then across keys; the first bad key stops the
run with one line ``<key>: <value> <what is wrong>; allowed: <what is>`` and no host changes.
"""

from __future__ import annotations

import copy
import difflib
import ipaddress
import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from servefleet.defaults import DEFAULTS, PREFIXES
from servefleet.errors import DataError, RecipeError

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
_DEB_PACKAGE = re.compile(r"[a-z0-9]([a-z0-9+.-]|\{kernel\})+")
_SLUG = re.compile(r"[a-z0-9_-]+")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # axes, index names
_AXIS_VALUE = re.compile(r"[^\x00-\x1f\x7f-\x9f%$]+")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")  # fmt: skip
_PATH = re.compile(r"[A-Za-z0-9._/-]+")
_COMMAND = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*|(/[A-Za-z0-9._-]+)+")
_DEB_LINE = re.compile(r"deb (\[[^\]]+\] )?(?P<url>\S+) \S+( \S+)*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REVISION = re.compile(r"[0-9a-f]{40}")
_DIGITS = re.compile(r"[0-9]{1,20}")
_GLIBC = re.compile(r"[1-9][0-9]{0,2}\.(0|[1-9][0-9]{0,2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NOT_IN_URL = re.compile(r"[\s\"'`\\<>{}|^\x00-\x1f\x7f-\x9f]")
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")

_URL_ALLOWED = "an https URL (http only on a host of pip_trusted_hosts), without user:password@"
_CREDS_ALLOWED = "a URL without user:password@ (creds_*_env name the variables holding secrets)"
_DIR_ALLOWED = "an absolute, normalised path of [A-Za-z0-9._/-] below a system directory"
_HOST_ALLOWED = "an IP address or a host name of [A-Za-z0-9.-]"
_VERSION_ALLOWED = "a PEP 440 version string in normal form, such as '3.5.1'"
_PIN_ALLOWED = "'name==version' (a PEP 508 name, a PEP 440 version), one pin per package"
_PACKAGES_ALLOWED = "a list of PEP 508 package names"
_INDEX_ALLOWED = (
    "index name -> {'url': URL, 'packages': [names], 'auth': True or False, 'glibc': '2.39'}"
)
_GLIBC_ALLOWED = "the lowest glibc the index's wheels need, as 'MAJOR.MINOR' (e.g. '2.39')"
_OWNED_ALLOWED = (
    "each package in one index at most, or in several that each declare a different glibc"
)
_DEB_ALLOWED = "one line 'deb [signed-by=KEYRING] URL SUITE [COMPONENT...]', no user:password@"
_REPO_ALLOWED = "{'src': deb source line, 'key': local key file (optional)}"
_DEB_PACKAGE_ALLOWED = "a list of Debian package names ([a-z0-9+.-], {kernel} = `uname -r`)"
_COMMAND_ALLOWED = "a command name or an absolute path, of [A-Za-z0-9._/-]"
_SELECTION_ALLOWED = (
    "axis -> value (or 'axis=value,...'), values without %, $ or control characters"
)
_USER_ALLOWED = "a system user name [a-z_][a-z0-9_-]{0,31}, not root"
_MODELS_ALLOWED = "model id ORG/NAME of [A-Za-z0-9._-] -> hex digest"


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name (``Rebel_Compiler`` -> ``rebel-compiler``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def load_defaults() -> dict[str, Any]:
    """Every data key with its default (a copy of :data:`servefleet.defaults.DEFAULTS`)."""
    return copy.deepcopy(DEFAULTS)


@dataclass(frozen=True)
class Index:
    """One package index and the distributions it owns."""

    name: str
    url: str
    packages: tuple[str, ...]
    auth: bool = False
    glibc: str | None = None  # the lowest glibc its wheels need (manylinux_2_39: "2.39")


@dataclass(frozen=True)
class Settings:
    """Validated deploy data for one host (see servefleet/defaults.py for each key's meaning)."""

    driver_version: str
    driver_runfile_url: str | None
    driver_sha256: dict[str, str]
    driver_installer_args: tuple[str, ...]
    driver_apt_packages: tuple[str, ...]
    driver_apt_repo: dict[str, str] | None
    pins: dict[str, str]
    extra_packages: dict[str, tuple[str, ...]]
    sdk_python: str
    installer: str
    lock_dir: str | None
    lock_python: str
    wheel_cache: str
    source: str
    wheelhouse: str | None
    indexes: tuple[Index, ...]
    public_index: str | None
    trusted_hosts: tuple[str, ...]
    index_user: str | None
    index_password: str | None
    hf_token: str | None
    hf_token_env: str  # the controller's variable hf_token comes from (named when refused)
    recipe: str
    strategy: str | None
    target: str
    selection: dict[str, str]
    recommended: bool
    base_port: int
    host: str | None
    user: str
    root: str
    home: str
    cache_root: str
    prewarm_timeout: int
    health_timeout: int
    gpu: str | None
    variant: str | None
    features: dict[str, str]
    instances: int | None
    load_timeout: int
    prewarm_scope: str
    prewarm_host: str | None
    prewarm_store: str
    hf_home: str
    models_store_url: str | None
    models_revisions: dict[str, str]
    models_sha256: dict[str, str]

    def owner_of(self, package: str) -> Index | None:
        """The index that owns ``package``, or None for the public index."""
        name = canonical_name(package)
        return next((i for i in self.indexes if name in i.packages), None)


# ---------------------------------------------------------------------------------------------
# Checks: each takes a value as pyinfra gives it and returns it converted, or raises _Refused


class _Refused(Exception):
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


def _bad(value: Any, problem: str, allowed: str) -> _Refused:
    return _Refused(f"{_show(value)} {problem}", allowed)


def _typed(value: Any, kind: type | tuple[type, ...], what: str, allowed: str) -> Any:
    """``value`` if it is a ``kind`` (str, list, Mapping: never converted), else refused."""
    if isinstance(value, kind):
        return value
    raise _Refused(f"expected {what}, got {_show(value)}", allowed)


def _one_line(what: str, allowed: str, *, empty: bool = False) -> Check:
    def check(value: Any) -> str:
        text = _typed(value, str, "a string", allowed)
        if not text and not empty:
            raise _bad(text, f"is not {what}", allowed)
        if _CONTROL.search(text):
            raise _bad(text, "holds a control character", allowed)
        return text

    return check


def _matching(pattern: re.Pattern[str], what: str, allowed: str) -> Check:
    def check(value: Any) -> str:
        text = _typed(value, str, "a string", allowed)
        if not pattern.fullmatch(text):
            raise _bad(text, f"is not {what}", allowed)
        return text

    return check


def _whole(low: int, high: int | None = None) -> Check:
    """An int (or a string of digits), never a bool or a float, within [low, high]."""
    allowed = f"{low}-{high}" if high is not None else f"a whole number >= {low}"

    def check(value: Any) -> int:
        if isinstance(value, str) and _DIGITS.fullmatch(value):
            number = int(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            raise _Refused(f"expected a whole number, got {_show(value)}", allowed)
        if number < low or (high is not None and number > high):
            raise _bad(value, "is out of range", allowed)
        return number

    return check


def _optional(check: Check) -> Check:
    def optional(value: Any) -> Any:
        if value is None:
            return None
        try:
            return check(value)
        except _Refused as e:
            raise _Refused(e.head, f"{e.allowed}, or None", e.where) from None

    return optional


def _within(where: str, check: Check, value: Any) -> Any:
    """``check(value)``, a refusal naming ``.<where>`` below the key."""
    try:
        return check(value)
    except _Refused as e:
        raise _Refused(e.head, e.allowed, f".{where}{e.where}") from None


def _listed(item: Check, allowed: str, *, empty: bool = True) -> Check:
    """A list (or tuple) of items, each checked; a tuple of the results."""

    def check(value: Any) -> tuple[Any, ...]:
        items = _typed(value, (list, tuple), "a list", allowed)
        if not items and not empty:
            raise _bad(value, "is empty", allowed)
        return tuple(item(v) for v in items)

    return check


def _entries(key: Check, value: Check, allowed: str) -> Check:
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
                close = _closest(name, fields)
                hint = f" (did you mean {close}?)" if close else ""
                raise _bad(name, f"is not a field{hint}", ", ".join(fields))
        missing = [name for name in required if name not in given]
        if missing:
            raise _Refused(f"has no {missing[0]!r}", allowed)
        return {name: _within(name, fields[name], v) for name, v in given.items()}

    return check


def _closest(name: Any, known: Iterable[str]) -> str | None:
    """The known name ``name`` is most likely a misspelling of (difflib), if any."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return close[0] if close else None


def _is_host(text: str) -> bool:
    """An IP address, or a host name of dot-separated [A-Za-z0-9-] labels (the last one not all
    digits: ``10.0.0.300`` is a bad address, not a name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return bool(_HOSTNAME.fullmatch(text)) and not text.rsplit(".", 1)[-1].isdigit()
    return True


def _host(value: Any) -> str:
    text = _typed(value, str, "a string", _HOST_ALLOWED)
    if not _is_host(text):
        raise _bad(text, "is not an IP address or a host name", _HOST_ALLOWED)
    return text


def _authority(url: str) -> str:
    """What stands between a URL's scheme and its path (``user:password@host:port``)."""
    rest = url.split(":", 1)[-1].lstrip("/")
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def _url(trusted: frozenset[str] | None, placeholder: str = "") -> Check:
    """An https URL, or http on a ``trusted`` host (any host when None: pip_trusted_hosts is
    bad, and refused in its turn); never with credentials (nor shows them)."""
    allowed = _URL_ALLOWED + (f" ({placeholder} is filled in)" if placeholder else "")

    def check(value: Any) -> str:
        url = _typed(value, str, "a string", allowed)
        if "@" in _authority(url):  # before any message that would show the password
            raise _Refused("credentials do not belong in data", _CREDS_ALLOWED)
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


_trusted_hosts = _listed(_host, "a list of IP addresses or host names")


def _trusted(value: Any) -> frozenset[str] | None:
    """pip_trusted_hosts as the URL checks see it, None when it is bad."""
    try:
        return frozenset(host.lower() for host in _trusted_hosts(value))
    except _Refused:
        return None


def _directory(value: Any) -> str:
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


def _version(value: Any) -> str:
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
            _version(version)
        except _Refused as e:
            raise _bad(text, f"has a bad version: {e.head}", _PIN_ALLOWED) from None
        if canonical_name(name) in out:
            raise _bad(text, f"pins {canonical_name(name)} a second time", _PIN_ALLOWED)
        out[canonical_name(name)] = version
    return out


def parse_pins(pins: Any, key: str = "sdk_pins") -> dict[str, str]:
    """``["name==1.0", ...]`` -> ``{canonical name: version}``; anything but ``==`` is refused."""
    try:
        return _pins(pins)
    except _Refused as e:
        raise e.error(key) from None


def default_compiler_version() -> str:
    """The rebel-compiler version the deploy's default data pins."""
    return parse_pins(load_defaults()["sdk_pins"])["rebel-compiler"]


# ---------------------------------------------------------------------------------------------
# The data keys (servefleet/defaults.py)


def _package(value: Any) -> str:
    name = _matching(_PACKAGE, "a package name", "a PEP 508 package name")(value)
    return canonical_name(name)


def _deb_source(value: Any) -> str:
    line = _one_line("a deb source line", _DEB_ALLOWED)(value)
    found = _DEB_LINE.fullmatch(line)
    if not found:
        raise _bad(line, "is not a deb source line", _DEB_ALLOWED)
    if "@" in _authority(found["url"]):
        raise _Refused("credentials do not belong in data", _CREDS_ALLOWED)
    if not found["url"].startswith(("http://", "https://", "file:/")):
        raise _bad(line, "has no http, https or file URL", _DEB_ALLOWED)
    return line


def _apt_repo(value: Any) -> dict[str, str]:
    key = _optional(_one_line("a file path", "a local file path (the repository's key)"))
    repo = _record({"src": _deb_source, "key": key}, ("src",), _REPO_ALLOWED)(value)
    if repo.get("key") and "signed-by=" not in repo["src"]:
        raise _bad(repo["key"], "is given but src has no [signed-by=KEYRING]", _REPO_ALLOWED)
    return {k: v for k, v in repo.items() if v is not None}


def _sdk_pins(value: Any) -> dict[str, str]:
    return _pins(value)


def _platform_pinned(pins: dict[str, str], recipe: Any) -> None:
    """The recipe's platform needs its packages pinned (RBLN: rebel-compiler and vllm-rbln; GPU:
    vllm). A recipe that is not a name of one is left to serve_recipe's own check."""
    from servefleet.platforms import platform_for

    try:
        required = platform_for(recipe).required_pins() if isinstance(recipe, str) else ()
    except RecipeError:
        return
    for name in required:
        if name not in pins:
            raise DataError(
                f"sdk_pins: {name} must be pinned; allowed: a list that pins {', '.join(required)}"
            )


def _indexes(url: Check) -> Check:
    spec = _record(
        {
            "url": url,
            "packages": _listed(_package, _PACKAGES_ALLOWED, empty=False),
            "auth": _bool,
            "glibc": _matching(_GLIBC, "a glibc version", _GLIBC_ALLOWED),
        },
        ("url", "packages"),
        _INDEX_ALLOWED,
    )
    by_name = _entries(_matching(_NAME, "an index name", _INDEX_ALLOWED), spec, _INDEX_ALLOWED)

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
                        raise _Refused(
                            f"{package} is owned by the {other.name} index already",
                            _OWNED_ALLOWED,
                            f".{name}.packages",
                        )
                    if Version(other.glibc) == Version(index.glibc):
                        raise _Refused(
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
    raise _Refused(f"expected true or false, got {_show(value)}", "True or False")


def _flag(value: Any) -> bool:
    """A bool, or one of the strings true/false/yes/no/1/0 (never an int)."""
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    try:
        return _bool(value)
    except _Refused as e:
        raise _Refused(e.head, "true, false (or 'yes', 'no', '1', '0')") from None


def _target(value: Any) -> str:
    allowed = ", ".join(TARGETS)
    text = _typed(value, str, "a string", allowed)
    target = {t.lower(): t for t in TARGETS}.get(text.lower())
    if target is None:
        raise _bad(text, "is not a target", allowed)
    return target


_axes = _entries(
    _matching(_NAME, "an axis name", _SELECTION_ALLOWED),
    _matching(_AXIS_VALUE, "an axis value", _SELECTION_ALLOWED),
    _SELECTION_ALLOWED,
)


_FEATURES = _entries(
    _matching(_SLUG, "a feature", "a feature name of the recipe"),
    _matching(_SLUG, "on, off or a mode", "on, off or a mode name"),
    "feature -> on, off or a mode",
)


def _features(value: Any) -> dict[str, str]:
    """A mapping feature -> on/off/mode, or its command-line form ``name=on,name=off``."""
    if isinstance(value, str):  # --data serve_features=spec_decoding=on
        pairs = [p.split("=", 1) for p in value.split(",") if p]
        if not all(len(p) == 2 for p in pairs):
            raise _Refused(
                f"expected NAME=MODE pairs separated by commas, got {_show(value)}",
                "feature -> on, off or a mode",
            )
        value = dict(pairs)
    result: dict[str, str] = _FEATURES(value)
    return result


def _selection(value: Any) -> dict[str, str]:
    """A mapping axis -> value, or its command-line form ``axis=value,axis=value``."""
    if isinstance(value, str):  # --data serve_selection=lmcache=cpu,spec_decode=suffix
        pairs = [p.split("=", 1) for p in value.split(",") if p]
        if not all(len(p) == 2 for p in pairs):
            raise _Refused(
                f"expected AXIS=VALUE pairs separated by commas, got {_show(value)}",
                _SELECTION_ALLOWED,
            )
        axes = [axis for axis, _ in pairs]
        twice = next((axis for axis in axes if axes.count(axis) > 1), None)
        if twice is not None:
            raise _bad(value, f"sets axis {twice!r} twice", _SELECTION_ALLOWED)
        value = dict(pairs)
    return dict(_axes(value))


def _command(value: Any) -> str:
    command = _matching(_COMMAND, "a command name or absolute path", _COMMAND_ALLOWED)(value)
    if command.startswith("/") and posixpath.normpath(command) != command:
        raise _bad(command, "is not normalised", _COMMAND_ALLOWED)
    return command


INSTALLERS = ("uv", "pip")


def _installer(value: Any) -> str:
    if value not in INSTALLERS:
        raise _bad(value, "is not an installer", " or ".join(INSTALLERS))
    return str(value)


def _python_specifier(value: Any) -> str:
    """A PEP 440 specifier of Python versions with at least one lower bound (``>=3.10``)."""
    allowed = "a version specifier such as >=3.10 or >=3.10,<3.14"
    if not isinstance(value, str):
        raise _Refused(f"expected a string, got {_show(value)}", allowed)
    try:
        spec = SpecifierSet(value)
    except InvalidSpecifier:
        raise _bad(value, "is not a version specifier", allowed) from None
    if not any(s.operator in (">=", ">", "==", "~=") for s in spec):
        raise _bad(value, "has no lower bound", allowed)
    return str(value)


SOURCES = ("index", "wheelhouse")


def _source(value: Any) -> str:
    if value not in SOURCES:
        raise _bad(value, "is not a package source", " or ".join(SOURCES))
    return str(value)


PREWARM_SCOPES = ("host", "fleet")


def _scope(value: Any) -> str:
    if value not in PREWARM_SCOPES:
        raise _bad(value, "is not a pre-warm scope", " or ".join(PREWARM_SCOPES))
    return str(value)


def _user(value: Any) -> str:
    name = _matching(_USER, "a system user name", _USER_ALLOWED)(value)
    if name == "root":
        raise _bad(name, "may not run the servers", _USER_ALLOWED)
    return name


def _checks(trusted: frozenset[str] | None) -> dict[str, Check]:
    """One check per data key, in the defaults' order; http is allowed on ``trusted``."""
    url = _url(trusted)
    env_name = _matching(_ENV_NAME, "an environment variable name", "[A-Za-z_][A-Za-z0-9_]*")
    sha256 = _matching(_SHA256, "a sha256", "64 lowercase hex digits")
    model = _matching(_MODEL_ID, "a model id", _MODELS_ALLOWED)
    return {
        "driver_version": _version,
        "driver_runfile_url": _optional(_url(trusted, "{version}")),
        "driver_sha256": _entries(_version, sha256, "driver version -> sha256 of its runfile"),
        "driver_installer_args": _listed(
            _one_line("an argument", "arguments without control characters", empty=True),
            "a list of arguments without control characters",
        ),
        "driver_apt_packages": _listed(
            _matching(_DEB_PACKAGE, "a Debian package name", _DEB_PACKAGE_ALLOWED),
            _DEB_PACKAGE_ALLOWED,
        ),
        "driver_apt_repo": _optional(_apt_repo),
        "sdk_pins": _sdk_pins,
        "sdk_extra_packages": _entries(
            _package, _listed(_package, _PACKAGES_ALLOWED), "extra -> package names"
        ),
        "sdk_python": _command,
        "sdk_installer": _installer,
        "sdk_lock": _optional(
            _one_line("a controller directory", "a directory path on the controller")
        ),
        "sdk_lock_python": _python_specifier,
        "sdk_wheel_cache": _one_line(
            "a controller directory", "a directory path on the controller"
        ),
        "sdk_source": _source,
        "sdk_wheelhouse": _optional(
            _one_line("a controller directory", "a directory path on the controller")
        ),
        "pip_indexes": _indexes(url),
        "pip_public_index": _optional(url),
        "pip_trusted_hosts": _trusted_hosts,
        "creds_index_user_env": env_name,
        "creds_index_password_env": env_name,
        "creds_hf_token_env": env_name,
        "serve_recipe": _one_line("a recipe", "a recipe name (rbln/<name>) or a recipe file path"),
        "serve_strategy": _optional(_matching(_SLUG, "a strategy slug", "a slug of [a-z0-9_-]")),
        "serve_target": _target,
        "serve_selection": _selection,
        "serve_recommended": _flag,
        "serve_base_port": _whole(1, MAX_PORT),
        "serve_host": _optional(_host),
        "serve_user": _user,
        "serve_root": _directory,
        "serve_home": _directory,
        "serve_cache_root": _directory,
        "serve_prewarm_timeout": _whole(1),
        "serve_health_timeout": _whole(1),
        "serve_hardware": _optional(
            _matching(_SLUG, "a GPU id", "a GPU id of vLLM's taxonomy (h200, b200, mi300x, ...)")
        ),
        "serve_variant": _optional(_matching(_SLUG, "a variant", "a variant name of the recipe")),
        "serve_features": _features,
        "serve_instances": _optional(_whole(1, 64)),
        "serve_load_timeout": _whole(1),
        "serve_prewarm_scope": _scope,
        "serve_prewarm_host": _optional(
            _one_line("an inventory host name", "a host name of the inventory")
        ),
        "serve_prewarm_store": _one_line(
            "a controller directory", "a directory path on the controller"
        ),
        "models_hf_home": _directory,
        "models_store_url": _optional(url),
        "models_revisions": _entries(
            model, _matching(_REVISION, "a commit", "40 lowercase hex digits"), _MODELS_ALLOWED
        ),
        "models_sha256": _entries(model, sha256, _MODELS_ALLOWED),
    }


KEYS = tuple(_checks(frozenset()))  # every data key, in the order of servefleet/defaults.py


# ---------------------------------------------------------------------------------------------
# Across keys: run right after the later key of each pair, so the first bad key is reported


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


_ACROSS: dict[str, Callable[[dict[str, Any], Mapping[str, str]], None]] = {
    "sdk_extra_packages": _extras_pinned,
    "sdk_wheelhouse": _wheelhouse,
    "pip_indexes": _indexes_pinned,
    "creds_index_password_env": _credentials,
}


def _refuse_unknown(keys: Iterable[str]) -> None:
    for key in sorted(k for k in keys if isinstance(k, str) and k.startswith(PREFIXES)):
        if key not in KEYS:
            close = _closest(key, KEYS)
            hint = (
                f"did you mean {close}?" if close else "allowed: the keys of servefleet/defaults.py"
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

    def read(key: str) -> Any:
        return get(key) if have is None or key in have else copy.deepcopy(DEFAULTS[key])

    values: dict[str, Any] = {}
    for key, check in _checks(_trusted(read("pip_trusted_hosts"))).items():
        try:
            values[key] = check(read(key))
        except _Refused as e:
            raise e.error(key) from None
        if key == "sdk_pins":
            _platform_pinned(values[key], read("serve_recipe"))
        if key in _ACROSS:
            _ACROSS[key](values, environ)

    def secret(key: str) -> str | None:
        return environ.get(values[key]) or None

    return Settings(
        driver_version=values["driver_version"],
        driver_runfile_url=values["driver_runfile_url"],
        driver_sha256=values["driver_sha256"],
        driver_installer_args=values["driver_installer_args"],
        driver_apt_packages=values["driver_apt_packages"],
        driver_apt_repo=values["driver_apt_repo"],
        pins=values["sdk_pins"],
        extra_packages=values["sdk_extra_packages"],
        sdk_python=values["sdk_python"],
        installer=values["sdk_installer"],
        lock_dir=values["sdk_lock"],
        lock_python=values["sdk_lock_python"],
        wheel_cache=values["sdk_wheel_cache"],
        source=values["sdk_source"],
        wheelhouse=values["sdk_wheelhouse"],
        indexes=values["pip_indexes"],
        public_index=values["pip_public_index"],
        trusted_hosts=values["pip_trusted_hosts"],
        index_user=secret("creds_index_user_env"),
        index_password=secret("creds_index_password_env"),
        hf_token=secret("creds_hf_token_env"),
        hf_token_env=values["creds_hf_token_env"],
        recipe=values["serve_recipe"],
        strategy=values["serve_strategy"],
        target=values["serve_target"],
        selection=values["serve_selection"],
        recommended=values["serve_recommended"],
        base_port=values["serve_base_port"],
        host=values["serve_host"],
        user=values["serve_user"],
        root=values["serve_root"],
        home=values["serve_home"],
        cache_root=values["serve_cache_root"],
        prewarm_timeout=values["serve_prewarm_timeout"],
        health_timeout=values["serve_health_timeout"],
        gpu=values["serve_hardware"],
        variant=values["serve_variant"],
        features=values["serve_features"],
        instances=values["serve_instances"],
        load_timeout=values["serve_load_timeout"],
        prewarm_scope=values["serve_prewarm_scope"],
        prewarm_host=values["serve_prewarm_host"],
        prewarm_store=values["serve_prewarm_store"],
        hf_home=values["models_hf_home"],
        models_store_url=values["models_store_url"],
        models_revisions=values["models_revisions"],
        models_sha256=values["models_sha256"],
    )
