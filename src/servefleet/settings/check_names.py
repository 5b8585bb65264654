"""The checks of names in deploy data: PEP 440 versions, exact pins, package names and the
package indexes that own them, Python specifiers, system users, and the name patterns the key
table matches (slugs, model ids, digests, Debian packages). Pure Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name as canonical_name  # PEP 503 (Rebel_Compiler)
from packaging.version import InvalidVersion, Version

from servefleet.base.remote import layout
from servefleet.settings.checks import (
    Check,
    Refused,
    bad,
    boolean,
    entries,
    listed,
    matching,
    record,
    show,
    typed,
)

_PACKAGE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")  # PEP 508 name
DEB_PACKAGE = re.compile(r"[a-z0-9]([a-z0-9+.-]|\{kernel\})+")
SLUG = re.compile(r"[a-z0-9_-]+")
PD_ROLE = re.compile(r"prefill|decode")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # axes, index names
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
MODEL_ID = layout.MODEL_ID  # the host contract's rule (it refuses '..' too)
SHA256 = re.compile(r"[0-9a-f]{64}")
REVISION = re.compile(r"[0-9a-f]{40}")
_GLIBC = re.compile(r"[1-9][0-9]{0,2}\.(0|[1-9][0-9]{0,2})")

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
DEB_PACKAGE_ALLOWED = "a list of Debian package names ([a-z0-9+.-], {kernel} = `uname -r`)"
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


def pep440_version(value: Any) -> str:
    """A PEP 440 version, written as ``packaging`` normalises it (so it compares as text)."""
    text = typed(value, str, "a string", _VERSION_ALLOWED)
    try:
        normal = str(Version(text))
    except InvalidVersion:
        raise bad(text, "is not a PEP 440 version", _VERSION_ALLOWED) from None
    if text != normal:
        raise bad(text, f"is not in normal form (write {normal!r})", _VERSION_ALLOWED)
    return text


def _pins(value: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for pin in typed(value, (list, tuple), "a list of 'name==version' pins", _PIN_ALLOWED):
        text = typed(pin, str, "a 'name==version' string", _PIN_ALLOWED)
        name, exact, version = text.partition("==")
        if not exact or not _PACKAGE.fullmatch(name):
            raise bad(text, "is not an exact pin", _PIN_ALLOWED)
        try:
            pep440_version(version)
        except Refused as e:
            raise bad(text, f"has a bad version: {e.head}", _PIN_ALLOWED) from None
        if canonical_name(name) in out:
            raise bad(text, f"pins {canonical_name(name)} a second time", _PIN_ALLOWED)
        out[canonical_name(name)] = version
    return out


def parse_pins(pins: Any, key: str = "sdk_pins") -> dict[str, str]:
    """``["name==1.0", ...]`` -> ``{canonical name: version}``; anything but ``==`` is refused."""
    try:
        return _pins(pins)
    except Refused as e:
        raise e.error(key) from None


def package_name(value: Any) -> str:
    name = matching(_PACKAGE, "a package name", "a PEP 508 package name")(value)
    return canonical_name(name)


def sdk_pins(value: Any) -> dict[str, str]:
    return _pins(value)


def indexes(url: Check) -> Check:
    spec = record(
        {
            "url": url,
            "packages": listed(package_name, PACKAGES_ALLOWED, empty=False),
            "auth": boolean,
            "glibc": matching(_GLIBC, "a glibc version", _GLIBC_ALLOWED),
        },
        ("url", "packages"),
        _INDEX_ALLOWED,
    )
    by_name = entries(matching(NAME, "an index name", _INDEX_ALLOWED), spec, _INDEX_ALLOWED)

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


def python_specifier(value: Any) -> str:
    """A PEP 440 specifier of Python versions with at least one lower bound (``>=3.10``)."""
    allowed = "a version specifier such as >=3.10 or >=3.10,<3.14"
    if not isinstance(value, str):
        raise Refused(f"expected a string, got {show(value)}", allowed)
    try:
        spec = SpecifierSet(value)
    except InvalidSpecifier:
        raise bad(value, "is not a version specifier", allowed) from None
    if not any(s.operator in (">=", ">", "==", "~=") for s in spec):
        raise bad(value, "has no lower bound", allowed)
    return str(value)


def user_name(value: Any) -> str:
    name = matching(_USER, "a system user name", _USER_ALLOWED)(value)
    if name == "root":
        raise bad(name, "may not run the servers", _USER_ALLOWED)
    return name
