"""Platforms: what differs between RBLN NPU hosts and GPU hosts, behind one seam.

One module per platform (:mod:`.rbln`, :mod:`.gpu`), each a :class:`Platform`: how its devices
are found in the host probe and checked against the recipe, whether and how a driver is
installed, the top package of a release and the pins it needs, the device-selection variable of
the units, how servers are grouped on devices, and how long a first start may take (RBLN
compiles; GPU servers load). The host plan, units, health gate, releases, rollback and
rollouts are shared and ask the spec's platform. A new platform is one module plus data.

Pure: no pyinfra import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from servefleet.errors import RecipeError

if TYPE_CHECKING:
    from servefleet.data import Settings
    from servefleet.spec import ServeSpec


@dataclass(frozen=True)
class Hardware:
    """A host's accelerators, as its platform read them from the probe.

    + source: what told (``rbln-smi``, ``lspci``, ``nvidia-smi``, ``amd-smi``, ``compile only``)
    + skus: one model name per device (``RBLN-CR13``, ``NVIDIA H200``)
    + devices: device indexes (the values of the devices variable)
    + driver_version: the driver's version, None when there is no driver
    + memory_mib: each device's memory (GPUs), empty when not known
    """

    source: str
    skus: tuple[str, ...]
    devices: tuple[int, ...]
    driver_version: str | None
    memory_mib: tuple[int, ...] = ()

    @property
    def sku(self) -> str | None:
        return self.skus[0] if len(set(self.skus)) == 1 else None


class Platform:
    """The interface each platform module implements (one instance, ``PLATFORM``)."""

    name = ""
    devices_env = ""  # the unit variable that gives a server its devices
    device_word = "devices"  # how units and messages name them
    driver_step = ""  # "runfile" (installed by servefleet) or "check" (must be there)
    compiles = False  # first starts compile a cache worth pre-warming (fingerprint)

    def devices_env_for(self, hardware: Hardware) -> str:
        """The unit variable that gives a server its devices on this host."""
        return self.devices_env

    def resolve(self, settings: Settings, sku: str | None = None) -> ServeSpec:
        """The serving spec the data selects (for the host's device model, once known)."""
        raise NotImplementedError

    def hardware(self, probe: dict[str, Any]) -> Hardware:
        """The host's devices, from the probe's output."""
        raise NotImplementedError

    def refusal(self, settings: Settings, spec: ServeSpec, hardware: Hardware) -> str | None:
        """Why this host must not serve the spec (one line), or None."""
        raise NotImplementedError

    def driver_needed(self, settings: Settings, hardware: Hardware) -> bool:
        return False

    def required_pins(self) -> tuple[str, ...]:
        """Distributions the data must pin for this platform."""
        raise NotImplementedError

    def top_requirement(self, settings: Settings, spec: ServeSpec) -> tuple[str, str]:
        """The release's top requirement (``vllm-rbln[kv-connectors]==0.12.0``) and its name."""
        raise NotImplementedError

    def imports(self, spec: ServeSpec) -> list[str]:
        """Modules that must import in the release before it counts as installed."""
        return list(spec.requirements.imports)

    def groups(self, settings: Settings, spec: ServeSpec, hardware: Hardware) -> list[str]:
        """The devices of each server on the host (``0,1``), one entry per instance."""
        per = spec.servers[0].npus
        devices = hardware.devices
        groups = [devices[i : i + per] for i in range(0, len(devices) - per + 1, per)]
        if settings.instances is not None:
            groups = groups[: settings.instances]
        return [",".join(str(d) for d in g) for g in groups]

    def first_start_timeout(self, settings: Settings) -> int:
        """Seconds a start that compiles or loads from scratch may take to pass the gate."""
        raise NotImplementedError


def platform_for_kind(kind: str) -> Platform:
    """The platform that serves recipes of ``kind`` (``rbln`` cards, ``vllm`` recipes).

    + kind: a recipe source's kind
    """
    from servefleet.platforms import gpu, rbln

    by_kind: dict[str, Platform] = {"rbln": rbln.PLATFORM, "vllm": gpu.PLATFORM}
    if kind not in by_kind:
        raise RecipeError(f"no platform serves {kind} recipes (platforms: {', '.join(by_kind)})")
    return by_kind[kind]


def platform_for(recipe: str) -> Platform:
    """The platform of the recipe ``serve_recipe`` names.

    + recipe: a recipe name or path
    """
    from servefleet.sources import find

    source, _ = find(recipe)
    return platform_for_kind(source.kind)
