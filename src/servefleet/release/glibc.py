"""Which index each owned package comes from on a host, by the host's glibc (pure).

Upstream's CPU build of vllm (``+cpu``) is ``manylinux_2_39`` only: a host with an older glibc
cannot install it ("no wheels with a matching platform tag"), and RBLN's workaround is a second
source of that wheel built for older glibc (rbln.md §3.1). So an entry of ``pip_indexes`` may
say ``"glibc": "2.39"``, the lowest glibc its wheels need, and a package may be owned by several
indexes when each says a different glibc. A host takes each such package from the owner with
the highest glibc its own glibc reaches; where no owner's glibc is reached, the host is refused
before any change with one line naming both versions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from packaging.version import Version

from servefleet.settings.check_names import Index

_LIBC = re.compile(r"glibc ([0-9]+\.[0-9]+)")


def host_glibc(confstr: object) -> str | None:
    """The glibc version (``"2.36"``) from what the probe read (``os.confstr`` of
    ``CS_GNU_LIBC_VERSION``: ``"glibc 2.36"``); None for anything else (musl, no answer).

    + confstr: the probe's ``libc`` value
    """
    m = _LIBC.fullmatch(confstr.strip()) if isinstance(confstr, str) else None
    return m.group(1) if m else None


def owners(indexes: Iterable[Index]) -> dict[str, list[Index]]:
    """Owned package -> every index that owns it, in the data's order.

    + indexes: ``pip_indexes`` (validated)
    """
    out: dict[str, list[Index]] = {}
    for index in indexes:
        for package in index.packages:
            out.setdefault(package, []).append(index)
    return out


def _need(index: Index) -> Version:
    return Version(index.glibc or "0")


def choose(indexes: Sequence[Index], glibc: str | None) -> dict[str, Index]:
    """Owned package -> the index it comes from on a host with this glibc: of several owners,
    the one with the highest glibc that is not above the host's (when none is, or the host's
    glibc is not known, the highest: :func:`glibc_refusal` says why it does not fit).

    + indexes: ``pip_indexes`` (validated: several owners each declare a different glibc)
    + glibc: the host's glibc (``"2.36"``); None: no host, or none found on it
    """
    chosen = {}
    for package, found in owners(indexes).items():
        fits = [i for i in found if glibc is not None and _need(i) <= Version(glibc)]
        chosen[package] = max(fits or found, key=_need)
    return chosen


def levels(indexes: Sequence[Index]) -> list[str | None]:
    """A glibc for each choice of owners a host can get, highest first (None when no index
    declares one: every host gets the same). A host's choice is the one of the highest level
    its glibc reaches, so these cover every host.

    + indexes: ``pip_indexes`` (validated)
    """
    declared = sorted({i.glibc for i in indexes if i.glibc}, key=Version, reverse=True)
    return [*declared] or [None]


def glibc_refusal(
    indexes: Sequence[Index], pins: Mapping[str, str], glibc: str | None
) -> str | None:
    """Why a host with this glibc cannot install these owned packages (one line), or None.

    + indexes: ``pip_indexes`` (validated)
    + pins: owned package -> version the host installs
    + glibc: the host's glibc; None: the probe found none (a host without glibc)
    """
    chosen = choose(indexes, glibc)
    every = owners(indexes)
    for package, version in sorted(pins.items()):
        index = chosen.get(package)
        if index is None or index.glibc is None:
            continue
        if glibc is not None and Version(index.glibc) <= Version(glibc):
            continue
        lowest = min(every[package], key=_need)
        sources = ", ".join(f"{i.name} {i.glibc or 'any'}" for i in every[package])
        here = f"glibc {glibc} here" if glibc else "no glibc found here"
        return f"{here}; {package}=={version} needs glibc >= {lowest.glibc} (sources: {sources})"
    return None
