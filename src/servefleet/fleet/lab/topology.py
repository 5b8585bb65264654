"""The lab's topology: its hosts (names, addresses, hardware, SKU, device count and Debian
base), checked from the ``lab up`` options, and its inventory groups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servefleet.fleet.lab import layout
from servefleet.fleet.lab.base import DEFAULT_SUITE, SUITES
from servefleet.fleet.lab.state import LabError


def _check_odd(
    option: str, odd: dict[str, str], names: list[str], what: str, allowed: list[str]
) -> None:
    """``--odd-*`` HOST=VALUE pairs name hosts of the lab and known values (one-line errors)."""
    for name, value in odd.items():
        if name not in names:
            raise LabError(f"{option} names host {name!r}; the lab has {', '.join(names)}")
        if value not in allowed:
            raise LabError(
                f"{option} {name}={value}: unknown {what}; allowed: {', '.join(allowed)}"
            )


def plan_hosts(
    count: int,
    devices: int,
    odd_skus: dict[str, str],
    hardware: str = layout.DEFAULT_HARDWARE,
    odd_hardware: dict[str, str] | None = None,
    base: str = DEFAULT_SUITE,
    odd_base: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The hosts of a lab: names, addresses, hardware, SKU, device count and Debian base
    (checked lab settings). An RBLN host (``cr13``) has ``devices`` NPUs of its SKU; a GPU host
    has its profile's GPUs (``sku``: their name, ``devices``: their count). ``base`` is the
    host's Debian suite, ``glibc`` and ``python`` its versions.

    + count: number of hosts (1..40)
    + devices: simulated NPUs per RBLN host
    + odd_skus: host name -> SKU for RBLN hosts that are not RBLN-CR13
    + hardware: the hardware of every host (``cr13`` or ``h200``)
    + odd_hardware: host name -> hardware (``cr13``, ``h100``, ``h200``) for hosts that differ
    + base: the Debian suite of every host (``bookworm``: glibc 2.36, ``trixie``: glibc 2.41)
    + odd_base: host name -> suite for hosts that differ
    + groups: more inventory groups -> their hosts (``router``: ``serve_router = "fleet"``;
      a role's group: ``serve_roles``)
    """
    if not 1 <= count <= 40:
        raise LabError(f"--hosts must be between 1 and 40, not {count}")
    if not 1 <= devices <= 16:
        raise LabError(f"--devices must be between 1 and 16, not {devices}")
    if hardware not in layout.LAB_HARDWARE:
        raise LabError(
            f"--hardware {hardware}: unknown hardware; allowed: {', '.join(layout.LAB_HARDWARE)}"
        )
    names = [f"{layout.HOST_PREFIX}{i}" for i in range(1, count + 1)]
    odd_hardware = odd_hardware or {}
    _check_odd("--odd-hardware", odd_hardware, names, "hardware", list(layout.HARDWARE))
    kinds = {name: odd_hardware.get(name, hardware) for name in names}
    if base not in SUITES:
        raise LabError(f"--base {base}: unknown base; allowed: {', '.join(SUITES)}")
    odd_base = odd_base or {}
    _check_odd("--odd-base", odd_base, names, "base", list(SUITES))
    suites = {name: odd_base.get(name, base) for name in names}
    _check_odd("--odd-sku", odd_skus, names, "SKU", sorted(layout.SKU_PCI_DEVICE))
    for name, sku in odd_skus.items():
        if kinds[name] != layout.RBLN_HARDWARE:
            raise LabError(
                f"--odd-sku {name}={sku}: {name} is a GPU host ({kinds[name]}), not an RBLN one"
            )
    hosts = []
    for i, name in enumerate(names, start=1):
        kind = kinds[name]
        if kind == layout.RBLN_HARDWARE:
            sku = odd_skus.get(name, layout.DEFAULT_SKU)
            card = {"sku": sku, "pci_device": layout.SKU_PCI_DEVICE[sku], "devices": devices}
        else:
            profile = layout.GPU_PROFILES[kind]
            card = {
                "sku": profile["name"],
                "pci_device": profile["pci_device"],
                "devices": profile["gpus"],
            }
        hosts.append(
            {
                "name": name,
                "address": layout.host_ip(i),
                "hardware": kind,
                **card,
                "netns": layout.NETNS_PREFIX + name,
                "base": suites[name],
                "glibc": SUITES[suites[name]][0],
                "python": SUITES[suites[name]][1],
            }
        )
    return hosts


def host_groups(hosts: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """The lab's inventory groups: ``lab`` (every host), then one per hardware present.

    + hosts: the planned hosts
    """
    groups = {"lab": [h["name"] for h in hosts]}
    for kind in layout.HARDWARE:
        members = [h["name"] for h in hosts if h["hardware"] == kind]
        if members:
            groups[kind] = members
    return groups
