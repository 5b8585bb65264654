"""The registry of hardware platforms: one module per platform, behind
:class:`~servefleet.platforms.base.Platform`.

+ :mod:`~servefleet.platforms.rbln`: RBLN NPUs (``rbln-smi``, a runfile driver, a compile cache)
+ :mod:`~servefleet.platforms.nvidia`, :mod:`~servefleet.platforms.amd`: GPUs (what they share:
  :mod:`~servefleet.platforms.gpu`)

A recipe family names the platforms that serve its recipes (``Kind.platforms``, in the order the
probe tries them); a host's platform is the one whose probe output shows its devices
(:func:`detect`). :func:`probe_commands` is what the probe runs for a family's platforms,
:func:`named` a platform by its name, :func:`deploy_env` the variables every platform's units set
themselves, :func:`keys_read` the data keys a platform reads. :func:`register` adds a platform
from outside this package (a test's), :func:`unregister` takes it out again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from servefleet.base.errors import RecipeError
from servefleet.platforms.amd import PLATFORM as AMD
from servefleet.platforms.base import Hardware, Platform, ProbeCommand, Wants
from servefleet.platforms.nvidia import PLATFORM as NVIDIA
from servefleet.platforms.rbln import PLATFORM as RBLN

PLATFORMS: list[Platform] = [RBLN, NVIDIA, AMD]
_BUILT_IN = (RBLN, NVIDIA, AMD)

__all__ = [
    "PLATFORMS",
    "Hardware",
    "Platform",
    "ProbeCommand",
    "Wants",
    "deploy_env",
    "detect",
    "keys_read",
    "named",
    "probe_commands",
    "register",
    "serving",
    "unregister",
]


def register(platform: Platform) -> None:
    """Add a platform to the registry (a recipe family then names it in ``Kind.platforms``).
    RecipeError when its name is another platform's.

    + platform: the platform's one instance
    """
    if any(p.name == platform.name for p in PLATFORMS):
        raise RecipeError(
            f"platform {platform.name!r} cannot be registered: the name is taken; allowed: a "
            f"name no registered platform has (platforms: {', '.join(p.name for p in PLATFORMS)})"
        )
    PLATFORMS.append(platform)


def unregister(platform: Platform) -> None:
    """Take a platform :func:`register` added out of the registry (the built-in ones stay).

    + platform: the platform's instance, as registered
    """
    if platform in _BUILT_IN:
        raise RecipeError(
            f"platform {platform.name!r} is built in; allowed: a platform register() added"
        )
    if platform in PLATFORMS:
        PLATFORMS.remove(platform)


def named(name: str) -> Platform:
    """The registered platform of this name.

    + name: a platform's name
    """
    for platform in PLATFORMS:
        if platform.name == name:
            return platform
    raise RecipeError(
        f"no platform {name!r}; allowed: {', '.join(p.name for p in PLATFORMS)} (registered)"
    )


def serving(family: str, names: Iterable[str]) -> list[Platform]:
    """The platforms that serve a recipe family: those it names, in its order, then every
    registered one that says it serves it (``Platform.serves``), in the registry's.

    + family: the family's name (``Kind.kind``)
    + names: the platforms it names (``Kind.platforms``)
    """
    named_ = [named(n) for n in names]
    return named_ + [p for p in PLATFORMS if family in p.serves and p not in named_]


def probe_commands(platforms: list[Platform]) -> list[ProbeCommand]:
    """What the host probe runs for the devices of a family's platforms: the first platform's
    commands, then each other's, skipped when the first platform's first command found
    something (an NVIDIA host runs no ``amd-smi``).

    + platforms: the family's platforms, in the order they are tried (:func:`serving`)
    """
    out = list(platforms[0].probe_commands) if platforms else []
    first = out[0][0] if out else None
    for platform in platforms[1:]:
        out += [
            (n, argv, form, unless or first) for n, argv, form, unless in platform.probe_commands
        ]
    return out


def detect(platforms: list[Platform], probe: dict[str, Any]) -> tuple[Platform, Hardware]:
    """A host's platform and its devices, from the probe's output: the first of the family's
    platforms that reads a device there, else the first that reads the output at all (an RBLN
    host before its NPUs are found), else the first platform with no device.

    + platforms: the family's platforms, in the order they are tried (:func:`serving`)
    + probe: the output of the probe (``remote/probe.py``) on the host
    """
    read: tuple[Platform, Hardware] | None = None
    for platform in platforms:
        hardware = platform.read(probe)
        if hardware is not None and hardware.devices:
            return platform, hardware
        if hardware is not None and read is None:
            read = platform, hardware
    return read or (platforms[0], platforms[0].empty())


def deploy_env() -> dict[str, str]:
    """The variables a registered platform's units set themselves (``Platform.deploy_env``) ->
    what decides them: a host's ``serve_extra_env`` sets none of them, whatever its platform."""
    out: dict[str, str] = {}
    for p in PLATFORMS:
        out |= {p.devices_env: "the host's device groups"} if p.devices_env else {}
        out |= p.deploy_env
    return out


def keys_read() -> dict[str, list[Platform]]:
    """Every data key a registered platform reads of its own -> the platforms that read it."""
    out: dict[str, list[Platform]] = {}
    for platform in PLATFORMS:
        for key in sorted(platform.keys):
            out.setdefault(key, []).append(platform)
    return out
